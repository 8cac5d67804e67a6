package framework

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/keyroll/keyroll/controllers/stoppoint"
	"github.com/keyroll/keyroll/test/testground"
)

// BuildOperator builds keyroll's manager binary (main.go) into dir.
func BuildOperator(dir string) (string, error) {
	bin := filepath.Join(dir, "keyroll")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = testground.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building keyroll: %v\n%s", err, out)
	}
	return bin, nil
}

// ProcessOptions adjust an operator started by StartProcess.
type ProcessOptions struct {
	// Kubeconfig is the API server to use (empty: the ground's).
	Kubeconfig string
	// StopAt, with StopNamespace, stops the operator at that point (controllers/stoppoint).
	StopAt        stoppoint.Point
	StopNamespace string
	// MetricsPort serves plain-HTTP metrics on 127.0.0.1 (0: none).
	MetricsPort int
	// Args are more flags.
	Args []string
	// Env is more environment, for the operator alone (GOMEMLIMIT=80MiB, say).
	Env []string
	// Line sees every line the operator logs.
	Line func(string)
}

// Process is keyroll's manager running against the test ground as its own process (its own
// process group), which a test can kill with SIGKILL.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	// Stopped receives the point once the process has stopped there.
	Stopped chan stoppoint.Point
	mu      sync.Mutex
	led     bool
}

// StartProcess starts bin against the ground as the package's operator identity, with leader
// election on and short leader-election timings (4 s lease), debug logs, and probes on a free
// loopback port.
func (f *Framework) StartProcess(bin string, o ProcessOptions) (*Process, error) {
	kubeconfig := o.Kubeconfig
	if kubeconfig == "" {
		kubeconfig = f.Ground.CP.Kubeconfig
	}
	metrics := "--metrics-bind-address=0"
	if o.MetricsPort > 0 {
		metrics = "--metrics-bind-address=127.0.0.1:" + strconv.Itoa(o.MetricsPort)
	}
	selector := ""
	if sel := f.Selector(); sel != nil {
		selector = sel.String()
	}
	args := append([]string{"--kubeconfig=" + kubeconfig, "--watch-selector=" + selector, "--zap-devel", metrics, "--metrics-secure=false",
		"--health-probe-bind-address=127.0.0.1:0", "--redis-probe-image=" + testground.ProbeImage,
		"--leader-election-namespace=" + f.OperatorNS, "--service-account-namespace=" + f.OperatorNS, "--service-account-name=" + OperatorSA,
		"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms",
		// No conversion webhook: the package's managers share the ground's CRDs (test/apiversions tests it).
		"--webhook-port=0"}, o.Args...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), o.Env...)
	if o.StopAt != "" {
		cmd.Env = append(cmd.Env, stoppoint.Env+"="+string(o.StopAt)+"@"+o.StopNamespace)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting keyroll: %w", err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{}), Stopped: make(chan stoppoint.Point, 1)}
	go p.read(stderr, o.Line)
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *Process) read(r io.Reader, line func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if line != nil {
			line(l)
		}
		if point, ok := strings.CutPrefix(l, stoppoint.Marker); ok {
			p.Stopped <- stoppoint.Point(point)
		}
		// client-go's leader election says so: "successfully acquired lease" up to v0.34,
		// "Successfully acquired lease" (structured) since.
		if strings.Contains(strings.ToLower(l), "successfully acquired lease") {
			p.mu.Lock()
			p.led = true
			p.mu.Unlock()
		}
	}
}

// PID is the operator's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Leading says whether the operator has acquired the leader-election Lease.
func (p *Process) Leading() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.led
}

// Kill ends the operator with SIGKILL (its process group, which is its own) and waits.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Usage is what the process has used so far: its peak resident memory (VmHWM) and its CPU time.
type Usage struct {
	PeakRSSBytes int64
	CPU          time.Duration
}

// Usage reads /proc for the process's peak RSS and CPU time.
func (p *Process) Usage() (Usage, error) { return UsageOf(p.PID()) }

// UsageOf reads /proc for the peak RSS and CPU time of the process pid (one of the ground's, or
// another controller's).
func UsageOf(pid int) (Usage, error) {
	var u Usage
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			u.PeakRSSBytes = kb * 1024
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// The fields after the command (which may hold spaces) start after its closing parenthesis;
	// utime and stime are the 14th and 15th fields of the line, in clock ticks (100 per second).
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) > 12 {
		ut, _ := strconv.ParseInt(fields[11], 10, 64)
		st, _ := strconv.ParseInt(fields[12], 10, 64)
		u.CPU = time.Duration(ut+st) * 10 * time.Millisecond
	}
	return u, nil
}
