package node

import (
	"archive/tar"
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

	"github.com/keyroll/keyroll/test/testground"
)

// `make image` builds the manager image as an OCI archive without any container engine (every
// engine's command is a stand-in that fails and records the call): the archive is an OCI image layout whose image runs /keyroll as a non-root user, and
// the real node's containerd imports it and runs it in a pod (here keyroll --help, which exits 0).
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

	cfg := imageConfig(t, archive)
	if cfg.Config.User != "65532:65532" || strings.Join(cfg.Config.Entrypoint, " ") != "/keyroll" {
		t.Errorf("the image runs %v as %q, want /keyroll as 65532:65532", cfg.Config.Entrypoint, cfg.Config.User)
	}
	if err := ground.Node.ImportImage(archive); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "keyroll-image"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "keyroll", Image: testground.ManagerImage, ImagePullPolicy: corev1.PullNever, Args: []string{"--help"},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{}) })
	eventually(t, 2*time.Minute, func() string {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodSucceeded || p.Spec.NodeName != testground.RealNodeName {
			return fmt.Sprintf("pod %s on %q: %s%s", p.Name, p.Spec.NodeName, p.Status.Phase, podSummary("default"))
		}
		return ""
	})
	logs, err := cs.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), "-lease-check-interval") {
		t.Errorf("keyroll --help in the image printed (%v):\n%s", err, logs)
	}
}

// ociConfig is the part of an OCI image configuration the test reads.
type ociConfig struct {
	Config struct {
		User       string   `json:"User"`
		Entrypoint []string `json:"Entrypoint"`
	} `json:"config"`
}

// imageConfig reads an OCI image layout archive: oci-layout, index.json, the manifest it names and
// the configuration the manifest names.
func imageConfig(t *testing.T, archive string) ociConfig {
	t.Helper()
	files := map[string][]byte{}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading %s: %v", archive, err)
		}
		if h.Typeflag == tar.TypeReg && (h.Size < 1<<20) {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[strings.TrimPrefix(h.Name, "./")] = b
		}
	}
	if !strings.Contains(string(files["oci-layout"]), `"imageLayoutVersion"`) {
		t.Fatalf("%s is not an OCI image layout (no oci-layout file)", archive)
	}
	blob := func(digest string) []byte {
		b, ok := files["blobs/"+strings.Replace(digest, ":", "/", 1)]
		if !ok {
			t.Fatalf("the archive has no blob %s", digest)
		}
		return b
	}
	var index struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d manifests", err, len(index.Manifests))
	}
	var manifest struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &manifest); err != nil {
		t.Fatal(err)
	}
	var cfg ociConfig
	if err := json.Unmarshal(blob(manifest.Config.Digest), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}
