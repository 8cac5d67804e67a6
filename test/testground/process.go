// Package testground starts the real components keyroll's tests run against: a kube-apiserver and
// etcd (envtest), kube-controller-manager, kwok's fake node (pods become Ready, nothing runs in
// them), a real node (Options.Node: containerd and runc, a CNI bridge of the ground's own, the
// kubelet, kube-proxy, CoreDNS without forwarder, and images built on the machine; see Node), a
// Vault dev server with the database secrets engine and Kubernetes auth, External Secrets
// Operator's controller, and redis-server. Every component is a real process on a loopback port
// (or, for the real node, on its bridge), and every Stop ends it; the real node also undoes what
// it changed on the machine, through a janitor process when the test process dies.
//
// The binaries come from test/tools/build.sh (make testground), which links them into test/bin;
// KEYROLL_TESTGROUND_BIN names another directory. Debian packages come from
// test/tools/install-deps.sh. A missing binary or package is an error that says how to get it:
// tests fail, they never skip.
package testground

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// BinDir is the directory holding the test-ground binaries.
func BinDir() string {
	if d := os.Getenv("KEYROLL_TESTGROUND_BIN"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "test", "bin")
}

// RepoRoot is the root of the keyroll checkout this package is compiled from.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Binary returns the path of a test-ground binary, or an error that says how to get it.
func Binary(name string) (string, error) {
	p := filepath.Join(BinDir(), name)
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return p, nil
	}
	return "", fmt.Errorf("test-ground binary %q not found in %s: run `make testground` (or test/tools/build.sh) first", name, BinDir())
}

// SystemBinary returns the path of a binary installed on the machine, or an error saying how to install it.
func SystemBinary(name, debianPackage string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found on PATH: install the Debian package %s (test/tools/install-deps.sh)", name, debianPackage)
	}
	return p, nil
}

// FreePort returns a TCP port that is free on 127.0.0.1 at the time of the call.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Process is a started component process whose output goes to a log file.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// StartProcess starts a binary in its own process group, with its output in dir/<name>.log. The
// process is killed if the test binary dies (parent-death signal).
func StartProcess(dir, name, bin string, args []string, env []string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process group: SIGTERM, then SIGKILL after a grace period. It waits until the
// group is gone, not only its leader: what the process started in its group (Vault's plugins, a
// CNI plugin containerd was running) ends with it, before Stop returns.
func (p *Process) Stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	if !p.Exited() {
		_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		<-p.done
	}
	if !waitGroupGone(p.PID(), 5*time.Second) {
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		waitGroupGone(p.PID(), 5*time.Second)
	}
}

// waitGroupGone waits up to timeout for every process of the group pgid to end, and says
// whether they did.
func waitGroupGone(pgid int, timeout time.Duration) bool {
	for end := time.Now().Add(timeout); groupLeft(pgid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// groupLeft says whether a process of the group pgid still exists.
func groupLeft(pgid int) bool {
	return syscall.Kill(-pgid, 0) == nil
}

// Tail returns the end of the process's log, for error messages.
func (p *Process) Tail() string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	const max = 3000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// waitFor polls check until it succeeds, the process exits or the timeout passes.
func waitFor(p *Process, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if p != nil && p.Exited() {
			return fmt.Errorf("%s exited early (%v); log tail:\n%s", p.Name, p.err, p.Tail())
		}
		if last = check(); last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	name := "component"
	if p != nil {
		name = p.Name
	}
	return errors.Join(fmt.Errorf("%s not ready after %s", name, timeout), last)
}

// Alive reports whether the process with this pid still runs: it exists and is not a zombie (a
// process that has ended, whose parent has not reaped it yet, holds nothing but its pid).
func Alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil && ProcessState(pid) != "Z"
}

// ProcessState is the state letter of a process as /proc/PID/stat gives it (R running, S sleeping,
// T stopped, Z zombie, ...), or the error reading it.
func ProcessState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return err.Error()
	}
	// The fields after the command name (which may hold spaces) start after the last ')'.
	rest := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(rest) == 0 {
		return ""
	}
	return rest[0]
}

// PortBound reports whether something listens on 127.0.0.1:port.
func PortBound(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// ChildPIDs lists the processes whose parent is this process (read from /proc).
func ChildPIDs() []int { return ChildPIDsOf(os.Getpid()) }

// ChildPIDsOf lists the processes whose parent is pid (read from /proc).
func ChildPIDsOf(self int) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The fields after the command name (which may hold spaces) start after the last ')'.
		rest := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(rest) > 1 {
			if ppid, _ := strconv.Atoi(rest[1]); ppid == self {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// ListeningAddrs lists the TCP addresses (ip:port) that the given processes listen on, read from
// /proc: the sockets in state LISTEN of /proc/net/tcp and tcp6 whose inodes the processes hold.
func ListeningAddrs(pids []int) ([]string, error) {
	inodes := map[string]bool{}
	for _, pid := range pids {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue // gone meanwhile
		}
		for _, fd := range fds {
			link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err == nil && strings.HasPrefix(link, "socket:[") {
				inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
			}
		}
	}
	var out []string
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] { // 0A: LISTEN
				continue
			}
			out = append(out, decodeProcAddr(f[1]))
		}
	}
	return out, nil
}

// decodeProcAddr turns /proc/net/tcp's "0100007F:1F90" into "127.0.0.1:8080" (and the tcp6 form
// into an IPv6 address).
func decodeProcAddr(s string) string {
	hexIP, hexPort, _ := strings.Cut(s, ":")
	port, _ := strconv.ParseUint(hexPort, 16, 16)
	raw, _ := hex.DecodeString(hexIP)
	ip := make(net.IP, len(raw))
	for i := 0; i+4 <= len(raw); i += 4 { // each 32-bit word is in host (little-endian) order
		ip[i], ip[i+1], ip[i+2], ip[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10))
}
