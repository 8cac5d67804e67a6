package faults

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyroll/keyroll/controllers/stoppoint"
	"github.com/keyroll/keyroll/test/framework"
)

// operator is keyroll's manager binary (built from main.go) running against the test ground as
// its own process, which the test kills with SIGKILL.
type operator struct {
	name string
	*framework.Process
}

// startOperator starts the manager, stopping at stopAt for the RedisClusters of namespace ns when
// stopAt is not empty. Its log goes to the package's log of operator processes (all of which the
// leak scan reads).
func startOperator(t *testing.T, name string, stopAt stoppoint.Point, ns string) *operator {
	t.Helper()
	return startOperatorOn(t, name, stopAt, ns, "")
}

// startOperatorOn is startOperator with the API server that kubeconfig names (an APIProxy's).
func startOperatorOn(t *testing.T, name string, stopAt stoppoint.Point, ns, kubeconfig string) *operator {
	t.Helper()
	p, err := fw.StartProcess(operatorBin, framework.ProcessOptions{
		Kubeconfig: kubeconfig, StopAt: stopAt, StopNamespace: ns,
		Line: func(l string) { logs.add(name, l) },
	})
	if err != nil {
		t.Fatal(err)
	}
	op := &operator{name: name, Process: p}
	t.Cleanup(op.Kill)
	return op
}

// waitStop waits until the operator stops at point, then kills it with SIGKILL.
func (o *operator) waitStop(t *testing.T, point stoppoint.Point, timeout time.Duration) {
	t.Helper()
	select {
	case p := <-o.Stopped:
		if p != point {
			t.Fatalf("%s stopped at %s, want %s", o.name, p, point)
		}
		o.Kill()
	case <-o.Done():
		t.Fatalf("%s exited before it reached %s:\n%s", o.name, point, logs.tail(o.name, 40))
	case <-time.After(timeout):
		t.Fatalf("%s did not reach %s within %s:\n%s", o.name, point, timeout, logs.tail(o.name, 40))
	}
}

// notStopped fails when the operator has stopped at its point already.
func (o *operator) notStopped(t *testing.T, when string) {
	t.Helper()
	select {
	case p := <-o.Stopped:
		t.Fatalf("%s stopped at %s %s, too early", o.name, p, when)
	default:
	}
}

// logBook keeps every operator process's log lines, by operator, and writes them all to one file
// (fw.Logs holds what operators in the test process log: none runs here).
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
