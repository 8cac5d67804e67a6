package testground

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The real node's images, built on this machine and imported into its containerd; nothing is
// pulled from a registry.
const (
	// PauseImage is every pod's sandbox: a static C program (images/pause.c).
	PauseImage = "localhost/keyroll/pause:testground"
	// RedisImage is Debian's redis-server 7.0 and redis-cli with their libraries, busybox's
	// applets as the shell and tools, and the redis user (uid 999). Its name is what a
	// RedisCluster with version "7.0" and the default image runs.
	RedisImage = "docker.io/library/redis:7.0"
	// ConsumerImage is test/consumer: a Redis client that runs SET/GET continuously with the
	// credential of a mounted Secret and counts failed commands (see test/consumer).
	ConsumerImage = "localhost/keyroll/consumer:testground"
	// ProbeImage is the Redis pods' probe sidecar alone (cmd/keyroll-probe at /keyroll-probe, where
	// the manager's image has it too): what a manager running outside the node is told with
	// --redis-probe-image. A manager in a pod runs the sidecar from its own image.
	ProbeImage = "localhost/keyroll/keyroll-probe:testground"
	// ManagerImage is keyroll's manager, built by `make image` (the path a user takes).
	ManagerImage = "localhost/keyroll/keyroll:testground"
	// CurlImage is Debian's curl with its libraries and busybox's applets: the chart's helm test
	// pod runs on it, under the name of the chart's default test.image.
	CurlImage = "docker.io/curlimages/curl:8.11.1"
)

// imageCacheDir is where built image archives are kept, keyed by their inputs: beside the tool
// binaries of test/tools/build.sh.
func imageCacheDir() string {
	base := os.Getenv("KEYROLL_TOOLS_CACHE")
	if base == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		base = filepath.Join(cache, "keyroll", "tools")
	}
	return filepath.Join(base, "images")
}

// imageSpec is an image to build: its name, how to fill its root directory and the ociimage
// flags of its config.
type imageSpec struct {
	name     string
	ref      string
	assemble func(rootfs string) error
	flags    []string
}

// buildImages builds (or takes from the cache) the pause, Redis, probe, consumer and curl images; they
// are imported once containerd runs.
func (n *Node) buildImages(context.Context) error {
	for _, spec := range []imageSpec{pauseImage(), redisImage(), probeImage(), consumerImage(), curlImage()} {
		archive, err := buildImage(n.Dir, spec)
		if err != nil {
			return fmt.Errorf("image %s: %w", spec.ref, err)
		}
		n.pendingImages = append(n.pendingImages, archive)
	}
	return nil
}

// buildImage assembles the image's root directory under work, and turns it into an OCI archive
// unless the cache already holds one for the same files and config.
func buildImage(work string, spec imageSpec) (string, error) {
	rootfs := filepath.Join(work, "images", spec.name)
	if err := os.RemoveAll(rootfs); err != nil {
		return "", err
	}
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return "", err
	}
	if err := spec.assemble(rootfs); err != nil {
		return "", err
	}
	key, err := treeHash(rootfs, append([]string{spec.ref}, spec.flags...))
	if err != nil {
		return "", err
	}
	cache := imageCacheDir()
	archive := filepath.Join(cache, fmt.Sprintf("%s-%s.tar", spec.name, key))
	defer pruneImages(cache, spec.name, archive)
	if _, err := os.Stat(archive); err == nil {
		return archive, os.RemoveAll(rootfs)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	tool, err := Binary("ociimage")
	if err != nil {
		return "", err
	}
	args := append([]string{"-rootfs", rootfs, "-name", spec.ref, "-o", archive}, spec.flags...)
	if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ociimage: %w: %s", err, out)
	}
	return archive, os.RemoveAll(rootfs)
}

// unusedImageAge is how long an image archive of an earlier build is kept unused before
// pruneImages removes it.
const unusedImageAge = 48 * time.Hour

// pruneImages marks the archive in use as used now, and removes the same image's archives of other
// inputs that no ground has used for unusedImageAge: each change to the consumer or the probe makes a
// new archive, and a long-lived machine (CI's) would otherwise fill its disk with them. It is best
// effort: an archive another ground is importing right now has been used within the age.
func pruneImages(cache, name, keep string) {
	now := time.Now()
	_ = os.Chtimes(keep, now, now)
	old, _ := filepath.Glob(filepath.Join(cache, name+"-????????????????.tar"))
	for _, p := range old {
		if fi, err := os.Stat(p); err == nil && p != keep && now.Sub(fi.ModTime()) > unusedImageAge {
			_ = os.Remove(p)
		}
	}
}

// treeHash is a short hash of every file's path, mode, owner, link target and content under
// dir, and of extra strings.
func treeHash(dir string, extra []string) (string, error) {
	h := sha256.New()
	for _, e := range extra {
		fmt.Fprintf(h, "%q\n", e)
	}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		uid, gid := uint32(0), uint32(0)
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = st.Uid, st.Gid
		}
		fmt.Fprintf(h, "%q %v %d:%d", rel, fi.Mode(), uid, gid)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " -> %q", target)
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
		}
		fmt.Fprintln(h)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:16], err
}

// ociLabels are the org.opencontainers.image labels of an image built here.
func ociLabels(title, description string) []string {
	return []string{
		"-label", "org.opencontainers.image.title=" + title,
		"-label", "org.opencontainers.image.description=" + description,
		"-label", "org.opencontainers.image.vendor=keyroll test ground",
	}
}

func pauseImage() imageSpec {
	return imageSpec{
		name: "pause", ref: PauseImage,
		assemble: func(rootfs string) error {
			src := filepath.Join(RepoRoot(), "test", "testground", "images", "pause.c")
			return run("gcc", "-static", "-Os", "-s", "-o", filepath.Join(rootfs, "pause"), src)
		},
		flags: append([]string{"-entrypoint", `["/pause"]`, "-user", "65535:65535"},
			ociLabels("pause", "The sandbox process of the test ground's pods")...),
	}
}

// goBuild builds the static binary of pkg (a path in this repository) as out.
func goBuild(pkg, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w: %s", pkg, err, b)
	}
	return nil
}

func probeImage() imageSpec {
	return imageSpec{
		name: "keyroll-probe", ref: ProbeImage,
		assemble: func(rootfs string) error {
			return goBuild("./cmd/keyroll-probe", filepath.Join(rootfs, "keyroll-probe"))
		},
		flags: append([]string{"-entrypoint", `["/keyroll-probe"]`, "-user", "65532:65532"},
			ociLabels("keyroll-probe", "The Redis pods' probe sidecar (cmd/keyroll-probe)")...),
	}
}

func consumerImage() imageSpec {
	return imageSpec{
		name: "consumer", ref: ConsumerImage,
		assemble: func(rootfs string) error {
			if err := goBuild("./test/consumer", filepath.Join(rootfs, "consumer")); err != nil {
				return err
			}
			return writePasswd(rootfs, "nonroot:x:65532:65532:nonroot:/:/sbin/nologin")
		},
		flags: append([]string{"-entrypoint", `["/consumer"]`, "-user", "65532:65532"},
			ociLabels("keyroll-consumer", "A Redis client that counts failed commands (test/consumer)")...),
	}
}

// redisUID is the redis user of the Redis image (as in the official image).
const redisUID = 999

func redisImage() imageSpec {
	return imageSpec{
		name: "redis", ref: RedisImage,
		assemble: assembleRedis,
		flags: append([]string{"-cmd", `["redis-server"]`, "-user", "999:999", "-workdir", "/data",
			"-env", "PATH=/usr/local/bin:/usr/bin:/bin"},
			ociLabels("redis", "Debian's redis-server and redis-cli 7.0 with busybox, for the test ground's real node")...),
	}
}

// assembleRedis copies Debian's Redis binaries (redis-server is redis-check-rdb under another
// name), every library they load and the loader, busybox with a link for each applet, and the
// files a container expects (passwd, group, /data owned by redis, /tmp).
func assembleRedis(rootfs string) error {
	rdb, _ := SystemBinary("redis-check-rdb", "redis-server")
	cli, _ := SystemBinary("redis-cli", "redis-tools")
	err := assembleWithBusybox(rootfs, map[string]string{"/usr/bin/redis-server": rdb, "/usr/bin/redis-cli": cli},
		"redis:x:999:999:redis:/data:/bin/sh")
	if err != nil {
		return err
	}
	return makeDirs(rootfs)
}

func curlImage() imageSpec {
	return imageSpec{
		name: "curl", ref: CurlImage,
		assemble: func(rootfs string) error {
			curl, _ := SystemBinary("curl", "curl")
			if err := assembleWithBusybox(rootfs, map[string]string{"/usr/bin/curl": curl}, "curl_user:x:100:101:curl:/home/curl_user:/bin/sh"); err != nil {
				return err
			}
			return os.MkdirAll(filepath.Join(rootfs, "tmp"), 0o1777)
		},
		flags: append([]string{"-entrypoint", `["/usr/bin/curl"]`, "-user", "100:101", "-env", "PATH=/usr/bin:/bin"},
			ociLabels("curl", "Debian's curl with busybox, for the chart's helm test on the test ground's real node")...),
	}
}

// assembleWithBusybox copies the binaries (image path: host path) and every library they and
// busybox load, busybox with a link for each applet, /etc/passwd and /etc/group with root and
// user, and an nsswitch.conf that resolves names by files and DNS.
func assembleWithBusybox(rootfs string, binaries map[string]string, user string) error {
	busybox, _ := SystemBinary("busybox", "busybox-static")
	copies := map[string]string{"/bin/busybox": busybox}
	for dst, src := range binaries {
		copies[dst] = src
	}
	for _, bin := range slices.Collect(maps.Values(copies)) { // busybox: none if it is the static build
		libs, err := sharedLibraries(bin)
		if err != nil {
			return err
		}
		for _, l := range libs {
			copies[l] = l
		}
	}
	for dst, src := range copies {
		if err := copyFile(src, filepath.Join(rootfs, dst)); err != nil {
			return err
		}
	}
	applets, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, a := range strings.Fields(string(applets)) {
		link := filepath.Join(rootfs, "bin", a)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink("busybox", link); err != nil {
			return err
		}
	}
	if err := writePasswd(rootfs, user); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(rootfs, "etc", "nsswitch.conf"), []byte("hosts: files dns\n"), 0o644)
}

func makeDirs(rootfs string) error {
	for dir, mode := range map[string]os.FileMode{"data": 0o750, "tmp": 0o1777, "run": 0o755, "usr/local/bin": 0o755} {
		p := filepath.Join(rootfs, dir)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
	}
	return os.Chown(filepath.Join(rootfs, "data"), redisUID, redisUID)
}

// writePasswd writes /etc/passwd and /etc/group with root and one more user (a passwd line).
func writePasswd(rootfs, user string) error {
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		return err
	}
	f := strings.Split(user, ":")
	passwd := "root:x:0:0:root:/root:/bin/sh\n" + user + "\n"
	group := "root:x:0:\n" + f[0] + ":x:" + f[3] + ":\n"
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(rootfs, "etc", "group"), []byte(group), 0o644)
}

// sharedLibraries lists the files ldd says a binary loads, the loader included.
func sharedLibraries(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}

// copyFile copies the content of src (links followed) to dst with src's permission bits.
func copyFile(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// LoadManagerImage builds keyroll's manager image with `make image` (the static binary on an
// empty base, as a user builds it) and imports it into the node as ManagerImage, once per
// process: the tree does not change while tests run, and a later call finds it loaded. A package
// whose tests need it loads it in its setup, before any test's clock starts: a cold build of the
// manager beside the suite's load takes minutes.
func (n *Node) LoadManagerImage(ctx context.Context) error {
	n.managerImage.Lock()
	defer n.managerImage.Unlock()
	if n.managerImage.loaded {
		return nil
	}
	archive := filepath.Join(n.Dir, "keyroll-image.tar")
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "image", "IMG="+ManagerImage, "IMAGE_ARCHIVE="+archive)
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make image: %w: %s", err, out)
	}
	if err := n.ImportImage(archive); err != nil {
		return err
	}
	n.managerImage.loaded = true
	return nil
}
