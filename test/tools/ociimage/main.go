// Command ociimage turns a directory into a one-layer OCI image archive that containerd imports
// without a registry (`ctr -n k8s.io images import ARCHIVE`): an oci-layout with one linux/amd64
// manifest, its config and one layer holding the directory, named by the index annotation
// io.containerd.image.name. The image is reproducible: file times are set to the epoch, so the
// same directory and flags give the same digests.
//
// Usage:
//
//	ociimage -rootfs DIR -name docker.io/library/redis:7.0 -o redis.tar \
//	  [-entrypoint '["/keyroll"]'] [-cmd '["redis-server"]'] [-user 999:999] [-workdir /data] \
//	  [-env K=V]... [-label org.opencontainers.image.title=...]...
package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// list is a repeatable string flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// spec is what the flags describe.
type spec struct {
	rootfs, name, out string
	entrypoint, cmd   []string
	user, workdir     string
	env               []string
	labels            map[string]string
}

func main() {
	s, err := parseFlags(os.Args[1:])
	if err == nil {
		err = build(s)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ociimage: %v\n", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (spec, error) {
	fl := flag.NewFlagSet("ociimage", flag.ContinueOnError)
	var s spec
	var entrypoint, cmd string
	var env, labels list
	fl.StringVar(&s.rootfs, "rootfs", "", "Directory that becomes the image's only layer (required).")
	fl.StringVar(&s.name, "name", "", "Full image reference, e.g. docker.io/library/redis:7.0 (required).")
	fl.StringVar(&s.out, "o", "", "Where to write the OCI archive (required).")
	fl.StringVar(&entrypoint, "entrypoint", "", `Entrypoint as a JSON array, e.g. '["/keyroll"]'.`)
	fl.StringVar(&cmd, "cmd", "", `Default arguments as a JSON array.`)
	fl.StringVar(&s.user, "user", "", "User (uid:gid) the image runs as.")
	fl.StringVar(&s.workdir, "workdir", "", "Working directory.")
	fl.Var(&env, "env", "Environment variable K=V (repeatable).")
	fl.Var(&labels, "label", "Config label K=V (repeatable), e.g. org.opencontainers.image.title=keyroll.")
	if err := fl.Parse(args); err != nil {
		return s, err
	}
	if s.rootfs == "" || s.name == "" || s.out == "" {
		return s, errors.New("-rootfs, -name and -o are required")
	}
	s.name = normalize(s.name)
	for flagName, v := range map[string]struct {
		raw string
		to  *[]string
	}{"entrypoint": {entrypoint, &s.entrypoint}, "cmd": {cmd, &s.cmd}} {
		if v.raw != "" {
			if err := json.Unmarshal([]byte(v.raw), v.to); err != nil {
				return s, fmt.Errorf("-%s: want a JSON array of strings: %w", flagName, err)
			}
		}
	}
	s.env = env
	s.labels = map[string]string{}
	for _, kv := range labels {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return s, fmt.Errorf("-label %q: want K=V", kv)
		}
		s.labels[k] = v
	}
	return s, nil
}

// build writes the archive: the layer, the image, an OCI layout in a temporary directory, and
// that layout as one tar file.
func build(s spec) error {
	tmp, err := os.MkdirTemp(filepath.Dir(s.out), ".ociimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	layerTar := filepath.Join(tmp, "layer.tar")
	if err := tarDir(s.rootfs, layerTar, true); err != nil {
		return fmt.Errorf("making the layer of %s: %w", s.rootfs, err)
	}
	img, err := image(s, layerTar)
	if err != nil {
		return err
	}
	dir := filepath.Join(tmp, "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	err = p.AppendImage(img,
		layout.WithAnnotations(map[string]string{
			"io.containerd.image.name":          s.name,
			"org.opencontainers.image.ref.name": refName(s.name),
		}),
		layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		return fmt.Errorf("writing the OCI layout: %w", err)
	}
	partial := s.out + ".partial"
	if err := tarDir(dir, partial, false); err != nil {
		return fmt.Errorf("writing %s: %w", s.out, err)
	}
	return os.Rename(partial, s.out)
}

// image is one layer on an empty base, with OCI media types and the config the flags describe.
func image(s spec, layerTar string) (v1.Image, error) {
	layer, err := tarball.LayerFromFile(layerTar, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config = v1.Config{
		Entrypoint: s.entrypoint, Cmd: s.cmd, User: s.user, WorkingDir: s.workdir,
		Env: s.env, Labels: s.labels,
	}
	return mutate.ConfigFile(img, cf)
}

// normalize spells a reference the way containerd (and the kubelet) name images: keyroll:dev is
// docker.io/library/keyroll:dev, a reference without a tag gets :latest.
func normalize(ref string) string {
	first, _, hasSlash := strings.Cut(ref, "/")
	if !hasSlash || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		if !hasSlash {
			ref = "library/" + ref
		}
		ref = "docker.io/" + ref
	}
	if !strings.Contains(ref, "@") && strings.LastIndexByte(ref, ':') < strings.LastIndexByte(ref, '/') {
		ref += ":latest"
	}
	return ref
}

// refName is the tag of a reference ("7.0" of docker.io/library/redis:7.0), or the reference.
func refName(ref string) string {
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		return ref[i+1:]
	}
	return ref
}

// tarDir writes the tree under dir into a tar file, in lexical order with the epoch as every
// file's time. With owners, files keep their uid and gid (an image's /data owned by its user);
// without, everything is root's.
func tarDir(dir, out string, owners bool) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	walkErr := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		return addEntry(tw, dir, path, owners)
	})
	return errors.Join(walkErr, tw.Close(), f.Close())
}

func addEntry(tw *tar.Writer, root, path string, owners bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(path); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	rel, _ := filepath.Rel(root, path)
	hdr.Name = filepath.ToSlash(rel)
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = time.Unix(0, 0), time.Time{}, time.Time{}
	hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = "", "", 0, 0
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && owners {
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	}
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	src, err := os.Open(path)
	if err != nil {
		return err
	}
	defer src.Close()
	_, err = io.Copy(tw, src)
	return err
}
