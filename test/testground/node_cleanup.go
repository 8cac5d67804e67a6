package testground

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
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
	if nodeDir != "" {
		for _, m := range MountsUnder(nodeDir) {
			out = append(out, "mount "+m)
		}
		for _, pid := range processesNaming(nodeDir) {
			out = append(out, fmt.Sprintf("process %d", pid))
		}
	}
	return out
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

// iptablesCommands are the iptables front ends whose tables the node may have changed.
func iptablesCommands() []string {
	var out []string
	for _, c := range []string{"iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy"} {
		if _, err := exec.LookPath(c + "-save"); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// nodeChain reports whether an iptables chain is one the node's components create: kube-proxy's
// and the kubelet's (KUBE-), or a CNI plugin's (CNI-).
func nodeChain(name string) bool {
	return strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "CNI-")
}

// NodeIPTablesChains lists, per iptables front end and table, the node's chains that exist.
func NodeIPTablesChains() []string {
	var out []string
	for _, cmd := range iptablesCommands() {
		b, err := exec.Command(cmd + "-save").Output()
		if err != nil {
			continue
		}
		table := ""
		for _, line := range strings.Split(string(b), "\n") {
			switch {
			case strings.HasPrefix(line, "*"):
				table = line[1:]
			case strings.HasPrefix(line, ":") && nodeChain(strings.Fields(line[1:])[0]):
				out = append(out, fmt.Sprintf("%s %s %s", cmd, table, strings.Fields(line[1:])[0]))
			}
		}
	}
	return out
}

// cleanIPTables removes the node's chains from every table: first the rules of other chains that
// jump to them, then their rules, then the chains, in one iptables-restore per table (which
// parses the saved rules, quotes included).
func cleanIPTables() error {
	var errs []error
	for _, cmd := range iptablesCommands() {
		b, err := exec.Command(cmd + "-save").Output()
		if err != nil {
			continue
		}
		for table, script := range iptablesCleanupScripts(string(b)) {
			c := exec.Command(cmd+"-restore", "--noflush")
			c.Stdin = strings.NewReader(script)
			if out, err := c.CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s-restore (%s table): %w: %s", cmd, table, err, out))
			}
		}
	}
	return errors.Join(errs...)
}

// iptablesCleanupScripts turns iptables-save output into, per table that holds node chains, the
// iptables-restore input that deletes them.
func iptablesCleanupScripts(saved string) map[string]string {
	out := map[string]string{}
	table := ""
	var chains, deletes []string
	flush := func() {
		if table != "" && len(chains) > 0 {
			var b strings.Builder
			fmt.Fprintf(&b, "*%s\n", table)
			for _, d := range deletes {
				fmt.Fprintln(&b, d)
			}
			for _, c := range chains {
				fmt.Fprintf(&b, "-F %s\n", c)
			}
			for _, c := range chains {
				fmt.Fprintf(&b, "-X %s\n", c)
			}
			b.WriteString("COMMIT\n")
			out[table] = b.String()
		}
		chains, deletes = nil, nil
	}
	for _, line := range strings.Split(saved, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			flush()
			table = line[1:]
		case strings.HasPrefix(line, ":"):
			if name := strings.Fields(line[1:])[0]; nodeChain(name) {
				chains = append(chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) > 1 && !nodeChain(f[1]) && jumpsToNodeChain(f) {
				deletes = append(deletes, "-D"+strings.TrimPrefix(line, "-A"))
			}
		}
	}
	flush()
	return out
}

func jumpsToNodeChain(fields []string) bool {
	for i, f := range fields[:len(fields)-1] {
		if (f == "-j" || f == "-g") && nodeChain(fields[i+1]) {
			return true
		}
	}
	return false
}

// The janitor is a process of its own (this test binary, started again) that outlives the test
// process: it waits until its standard input closes, which happens when the test process ends in
// any way, panics and timeouts included, and then cleans the node up unless Stop already did.
const janitorEnv = "KEYROLL_TESTGROUND_NODE_JANITOR"

func init() {
	if os.Getenv(janitorEnv) == "1" {
		os.Exit(runJanitor())
	}
}

func runJanitor() int {
	_, _ = io.Copy(io.Discard, os.Stdin) // returns when the test process is gone or Stop closed the pipe
	s, err := loadNodeState()
	if errors.Is(err, os.ErrNotExist) {
		return 0 // Stop cleaned up
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testground janitor: %v\n", err)
		return 1
	}
	// The test process's own children die with it (parent-death signal); give them a moment.
	time.Sleep(500 * time.Millisecond)
	if err := cleanupNode(s); err != nil {
		fmt.Fprintf(os.Stderr, "testground janitor: %v\n", err)
		return 1
	}
	if os.Getenv("KEYROLL_KEEP_TESTGROUND") == "" {
		_ = os.RemoveAll(s.Dir)
	}
	return 0
}

// janitor is the running janitor process, and the pipe that keeps it waiting.
type janitor struct {
	cmd *exec.Cmd
	w   *os.File
}

// startJanitor starts this binary again as a janitor, in a process group of its own (so that
// signals to the test's group do not reach it) with its output in logPath. It inherits the node
// lock, so that no other node starts before it has cleaned up.
func startJanitor(logPath string, lock *os.File) (*janitor, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), janitorEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, logFile, logFile
	cmd.ExtraFiles = []*os.File{lock}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close()
	logFile.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("starting the node's janitor: %w", err)
	}
	return &janitor{cmd: cmd, w: w}, nil
}

// release lets the janitor go (after Stop cleaned up, it finds nothing to do) and waits for it.
func (j *janitor) release() {
	if j == nil {
		return
	}
	j.w.Close()
	done := make(chan struct{})
	go func() { _ = j.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = j.cmd.Process.Kill()
		<-done
	}
}
