package node

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// `make image` builds the manager image as an OCI archive without any container engine (every
// engine's command is a stand-in that fails and records the call): the archive is an OCI image
// layout whose image runs /keyroll as a non-root user, carries the org.opencontainers.image labels
// (title, description, revision, source, version) and a CA bundle, and the real node's containerd
// imports it and runs it in a pod (here keyroll --help, which exits 0).
func TestManagerImageIsBuiltWithoutDocker(t *testing.T) {
	// Container engines on PATH (this machine has a docker client) are shadowed by stand-ins that
	// record any call and fail, and no engine socket is reachable.
	shims, calls := t.TempDir(), filepath.Join(t.TempDir(), "engine-calls")
	for _, engine := range []string{"docker", "podman", "buildah", "nerdctl"} {
		script := fmt.Sprintf("#!/bin/sh\necho %s \"$@\" >> %q\nexit 1\n", engine, calls)
		if err := os.WriteFile(filepath.Join(shims, engine), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	archive := filepath.Join(t.TempDir(), "keyroll-image.tar")
	start := time.Now()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "image", "IMG="+testground.ManagerImage, "IMAGE_ARCHIVE="+archive)
	cmd.Dir = testground.RepoRoot()
	cmd.Env = append(os.Environ(), "PATH="+shims+":"+os.Getenv("PATH"), "DOCKER_HOST=unix:///nonexistent/docker.sock", "CONTAINER_HOST=unix:///nonexistent/podman.sock")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(calls); err == nil {
		t.Errorf("make image called a container engine:\n%s", b)
	}
	t.Logf("make image: %s", time.Since(start).Round(time.Millisecond))

	cfg, layer := readImage(t, archive)
	if cfg.Config.User != "65532:65532" || strings.Join(cfg.Config.Entrypoint, " ") != "/keyroll" {
		t.Errorf("the image runs %v as %q, want /keyroll as 65532:65532", cfg.Config.Entrypoint, cfg.Config.User)
	}
	for _, l := range []string{"title", "description", "revision", "source", "version"} {
		if v := cfg.Config.Labels["org.opencontainers.image."+l]; strings.TrimSpace(v) == "" {
			t.Errorf("the image has no label org.opencontainers.image.%s (labels: %v)", l, cfg.Config.Labels)
		}
	}
	// Go's crypto/x509 reads the system's CA bundle from here: a Vault server with a certificate of
	// a public CA is verified in the image as on the distroless base of the Dockerfile.
	const caBundle = "etc/ssl/certs/ca-certificates.crt"
	if b, ok := layer[caBundle]; !ok || !strings.HasPrefix(strings.TrimSpace(string(b)), "-----BEGIN CERTIFICATE-----") ||
		strings.Count(string(b), "-----BEGIN CERTIFICATE-----") < 10 {
		t.Errorf("the image's layer has no CA bundle at /%s (%d bytes, in the layer %v)", caBundle, len(b), ok)
	}
	if err := fw.Ground.Node.ImportImage(archive); err != nil {
		t.Fatal(err)
	}
	ns := fw.Namespace(t, "image") // its pods are deleted when the test ends
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "keyroll-image"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "keyroll", Image: testground.ManagerImage, ImagePullPolicy: corev1.PullNever, Args: []string{"--help"},
			}},
		},
	}
	framework.Eventually(t, 30*time.Second, func() string { // the namespace's default ServiceAccount comes first
		if _, err := fw.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err.Error()
		}
		return ""
	})
	framework.Eventually(t, 2*time.Minute, func() string {
		p, err := fw.Clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodSucceeded || p.Spec.NodeName != testground.RealNodeName {
			return fmt.Sprintf("pod %s on %q: %s%s", p.Name, p.Spec.NodeName, p.Status.Phase, fw.PodSummary(ns))
		}
		return ""
	})
	logs, err := fw.Clientset.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), "-lease-check-interval") {
		t.Errorf("keyroll --help in the image printed (%v):\n%s", err, logs)
	}
}

// ociConfig is the part of an OCI image configuration the test reads.
type ociConfig struct {
	Config struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// ociDescriptor names a blob of an OCI image layout.
type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
}

// readImage reads an OCI image layout archive: oci-layout, index.json, the manifest it names, the
// configuration the manifest names, and the regular files of its layers (by path, without the
// leading slash; the content of those under 1 MiB, nil for the larger ones).
func readImage(t *testing.T, archive string) (ociConfig, map[string][]byte) {
	t.Helper()
	files := map[string][]byte{}
	eachFile(t, archive, func(name string, size int64, r io.Reader) {
		if size < 1<<20 {
			files[name] = readAll(t, r)
		}
	})
	if !strings.Contains(string(files["oci-layout"]), `"imageLayoutVersion"`) {
		t.Fatalf("%s is not an OCI image layout (no oci-layout file)", archive)
	}
	blob := func(digest string) []byte {
		b, ok := files[blobPath(digest)]
		if !ok {
			t.Fatalf("the archive has no blob %s", digest)
		}
		return b
	}
	var index struct {
		Manifests []ociDescriptor `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d manifests", err, len(index.Manifests))
	}
	var manifest struct {
		Config ociDescriptor   `json:"config"`
		Layers []ociDescriptor `json:"layers"`
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &manifest); err != nil {
		t.Fatal(err)
	}
	var cfg ociConfig
	if err := json.Unmarshal(blob(manifest.Config.Digest), &cfg); err != nil {
		t.Fatal(err)
	}
	layers := map[string]ociDescriptor{}
	for _, l := range manifest.Layers {
		layers[blobPath(l.Digest)] = l
	}
	inLayers := map[string][]byte{}
	eachFile(t, archive, func(name string, _ int64, r io.Reader) {
		l, ok := layers[name]
		if !ok {
			return
		}
		if strings.HasSuffix(l.MediaType, "+gzip") {
			zr, err := gzip.NewReader(r)
			if err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
			defer zr.Close()
			r = zr
		}
		eachEntry(t, l.Digest, r, func(name string, size int64, r io.Reader) {
			inLayers[name] = nil
			if size < 1<<20 {
				inLayers[name] = readAll(t, r)
			}
		})
	})
	if len(manifest.Layers) == 0 || len(inLayers) == 0 {
		t.Fatalf("the image has %d layers, with %d files", len(manifest.Layers), len(inLayers))
	}
	return cfg, inLayers
}

// blobPath is where an OCI image layout keeps the blob of a digest.
func blobPath(digest string) string { return "blobs/" + strings.Replace(digest, ":", "/", 1) }

// eachFile calls fn with each regular file of a tar archive, by name without a leading "./".
func eachFile(t *testing.T, archive string, fn func(name string, size int64, r io.Reader)) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	eachEntry(t, archive, f, fn)
}

// eachEntry calls fn with each regular file of a tar stream, by name without a leading "./" or "/".
func eachEntry(t *testing.T, what string, r io.Reader, fn func(name string, size int64, r io.Reader)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("reading %s: %v", what, err)
		}
		if h.Typeflag == tar.TypeReg {
			fn(strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "/"), h.Size, tr)
		}
	}
}

func readAll(t *testing.T, r io.Reader) []byte {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
