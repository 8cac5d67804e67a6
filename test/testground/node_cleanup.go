package testground

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Where the one real node of this machine keeps its lock and the record of what to clean up. The
// kubelet and containerd use some fixed host paths and cgroups, so only one node runs at a time.
const (
	nodeLockFile  = "/run/keyroll-testground-node.lock"
	nodeStateFile = "/run/keyroll-testground-node.json"
)

// fixedHostPaths are created by the kubelet, containerd or the CNI library outside the ground's
// directory, whatever their configuration says; those that did not exist before are removed.
var fixedHostPaths = []string{
	"/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/run/containerd", "/var/lib/cni", "/run/netns",
}

// nodeCgroups are the top-level cgroups the kubelet (cgroupfs driver) and containerd create in
// every hierarchy.
var nodeCgroups = []string{"kubepods", "k8s.io"}

// nodeState is what a node changed on the machine, written before the change is made, so that a
// janitor (or the next start) can undo it even when the test process dies.
type nodeState struct {
	Dir          string            `json:"dir"`
	Sysctls      map[string]string `json:"sysctls"`
	CreatedPaths []string          `json:"createdPaths"`
}

func (s *nodeState) save() error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(nodeStateFile, b, 0o600)
}

func loadNodeState() (*nodeState, error) {
	b, err := os.ReadFile(nodeStateFile)
	if err != nil {
		return nil, err
	}
	s := &nodeState{}
	return s, json.Unmarshal(b, s)
}

// NodeLeftovers describes what a real node left on the machine: its record, its bridge, its
// iptables chains, its cgroups, the mounts under its directory (none once it has stopped).
func NodeLeftovers(nodeDir string) []string {
	var out []string
	if _, err := os.Stat(nodeStateFile); err == nil {
		out = append(out, "the record "+nodeStateFile)
	}
	if bridgeExists() {
		out = append(out, "the bridge "+NodeBridge)
	}
	for _, c := range NodeIPTablesChains() {
		out = append(out, "iptables chain "+c)
	}
	for _, c := range cgroupDirs() {
		out = append(out, "cgroup "+c)
	}
	return append(out, NodeLeftoversUnder(nodeDir)...)
}

// NodeLeftoversUnder describes what the real node at nodeDir left that names its directory:
// mounts under it and processes whose command line names it ("" : nothing).
func NodeLeftoversUnder(nodeDir string) []string {
	if nodeDir == "" {
		return nil
	}
	var out []string
	for _, m := range MountsUnder(nodeDir) {
		out = append(out, "mount "+m)
	}
	for _, pid := range processesNaming(nodeDir) {
		out = append(out, fmt.Sprintf("process %d", pid))
	}
	return out
}

// NodeRecordDir is the directory of the real node the machine's record names: the node running
// now, or the one whose clean-up is not done ("" without a record).
func NodeRecordDir() string {
	s, err := loadNodeState()
	if err != nil {
		return ""
	}
	return s.Dir
}

// cleanupNode undoes everything a node did: it ends the node's processes (those whose command
// line names the node's directory, which includes containerd's shims) and every process left in
// the node's cgroups (the containers), unmounts what is mounted under the directory deepest
// first, deletes the bridge, the iptables chains kube-proxy and the kubelet add, the cgroups, the
// fixed host paths the node created, and restores the sysctls. Each step runs even if an earlier
// one failed.
func cleanupNode(s *nodeState) error {
	var errs []error
	if s.Dir != "" {
		killProcessesNaming(s.Dir)
	}
	errs = append(errs, killCgroupProcesses())
	if s.Dir != "" {
		errs = append(errs, unmountUnder(s.Dir))
	}
	errs = append(errs, deleteBridge(), cleanIPTables(), removeCgroups(), restoreSysctls(s.Sysctls))
	for _, p := range s.CreatedPaths {
		errs = append(errs, os.RemoveAll(p))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(nodeStateFile); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// killProcessesNaming sends SIGKILL to every process (but this one) whose command line contains
// dir, a directory no other program on the machine knows, and waits briefly for them to go.
func killProcessesNaming(dir string) {
	for range 20 {
		pids := processesNaming(dir)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// processesNaming lists the processes whose command line contains s.
func processesNaming(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) && !zombie(pid) {
			out = append(out, pid)
		}
	}
	return out
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	rest := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(rest) > 0 && rest[0] == "Z"
}

// cgroupDirs lists the node's cgroup directories in every hierarchy, deepest first.
func cgroupDirs() []string {
	var dirs []string
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hierarchies {
		for _, name := range nodeCgroups {
			_ = filepath.WalkDir(filepath.Join(h, name), func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
		}
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// NodeCgroups lists the cgroups a real node left on the machine (none once it is stopped).
func NodeCgroups() []string { return cgroupDirs() }

// killCgroupProcesses kills every process in the node's cgroups: the containers, which containerd's
// shims started and which no parent-death signal ends.
func killCgroupProcesses() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []int
		for _, d := range cgroupDirs() {
			left = append(left, cgroupProcs(d)...)
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v are still in the node's cgroups", left)
		}
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func cgroupProcs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && !zombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func removeCgroups() error {
	var errs []error
	for _, d := range cgroupDirs() {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// MountsUnder lists the mount points under dir (from /proc/self/mountinfo), deepest first.
func MountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder unmounts everything mounted under dir, deepest first; a busy mount is detached.
func unmountUnder(dir string) error {
	for range 5 {
		mounts := MountsUnder(dir)
		if len(mounts) == 0 {
			return nil
		}
		for _, m := range mounts {
			if err := syscall.Unmount(m, 0); err != nil {
				_ = syscall.Unmount(m, syscall.MNT_DETACH)
			}
		}
	}
	if left := MountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("still mounted under %s: %v", dir, left)
	}
	return nil
}
