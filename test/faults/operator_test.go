package faults

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keyroll/keyroll/controllers/stoppoint"
	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

// operator is keyroll's manager binary (built from main.go) running against the test ground as
// its own process, which the test kills with SIGKILL.
type operator struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	// stopped receives the point once the process has stopped there (stoppoint.Reached).
	stopped chan stoppoint.Point
	mu      sync.Mutex
	led     bool // it logged that it acquired the leader-election Lease
}

// buildOperator builds the manager binary into dir.
func buildOperator(dir string) (string, error) {
	bin := filepath.Join(dir, "keyroll")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = testground.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building keyroll: %v\n%s", err, out)
	}
	return bin, nil
}

// startOperator starts the manager, stopping at stopAt for the RedisClusters of namespace ns when
// stopAt is not empty. Its log goes to the package's log (all of which the leak scan reads).
func startOperator(t *testing.T, name string, stopAt stoppoint.Point, ns string) *operator {
	t.Helper()
	return startOperatorOn(t, name, stopAt, ns, ground.CP.Kubeconfig)
}

// startOperatorOn is startOperator with the API server that kubeconfig names (an APIProxy's).
func startOperatorOn(t *testing.T, name string, stopAt stoppoint.Point, ns, kubeconfig string) *operator {
	t.Helper()
	cmd := exec.Command(operatorBin, "--kubeconfig="+kubeconfig, "--zap-devel",
		"--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:0",
		"--leader-election-namespace="+harness.OperatorNS, "--service-account-namespace="+harness.OperatorNS,
		"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms")
	cmd.Env = os.Environ()
	if stopAt != "" {
		cmd.Env = append(cmd.Env, stoppoint.Env+"="+string(stopAt)+"@"+ns)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting keyroll: %v", err)
	}
	op := &operator{name: name, cmd: cmd, done: make(chan struct{}), stopped: make(chan stoppoint.Point, 1)}
	go op.read(t, stderr)
	go func() { _ = cmd.Wait(); close(op.done) }()
	t.Cleanup(op.kill)
	return op
}

// read copies the operator's log into the package's log, watching for a stop point and for
// the leader election.
func (o *operator) read(t *testing.T, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		logs.add(o.name, line)
		if p, ok := strings.CutPrefix(line, stoppoint.Marker); ok {
			o.stopped <- stoppoint.Point(p)
		}
		if strings.Contains(line, "successfully acquired lease") {
			o.mu.Lock()
			o.led = true
			o.mu.Unlock()
		}
	}
}

// waitStop waits until the operator stops at point, then kills it with SIGKILL.
func (o *operator) waitStop(t *testing.T, point stoppoint.Point, timeout time.Duration) {
	t.Helper()
	select {
	case p := <-o.stopped:
		if p != point {
			t.Fatalf("%s stopped at %s, want %s", o.name, p, point)
		}
		o.kill()
	case <-o.done:
		t.Fatalf("%s exited before it reached %s:\n%s", o.name, point, logs.tail(o.name, 40))
	case <-time.After(timeout):
		t.Fatalf("%s did not reach %s within %s:\n%s", o.name, point, timeout, logs.tail(o.name, 40))
	}
}

// notStopped fails when the operator has stopped at its point already.
func (o *operator) notStopped(t *testing.T, when string) {
	t.Helper()
	select {
	case p := <-o.stopped:
		t.Fatalf("%s stopped at %s %s, too early", o.name, p, when)
	default:
	}
}

// leading says whether the operator has acquired the leader-election Lease.
func (o *operator) leading() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.led
}

// kill ends the operator with SIGKILL (by its process group, which is its own) and waits.
func (o *operator) kill() {
	select {
	case <-o.done:
		return
	default:
	}
	_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGKILL)
	<-o.done
}

// logBook keeps every operator's log lines, by operator, and writes them all to one file.
type logBook struct {
	mu    sync.Mutex
	lines map[string][]string
	all   []string
}

var logs = &logBook{lines: map[string][]string{}}

func (b *logBook) add(name, line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines[name] = append(b.lines[name], line)
	b.all = append(b.all, name+": "+line)
}

// tail is the last n lines of one operator's log.
func (b *logBook) tail(name string, n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.lines[name]
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// text is every line logged so far.
func (b *logBook) text() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.all, "\n")
}
