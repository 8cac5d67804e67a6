package nodetrust

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/keyroll/keyroll/test/framework"
)

// sidecarProcess finds the probe sidecar of the pod with IP ip among this machine's processes
// (the test ground's node runs here): the one keyroll-probe told to listen on that IP.
func sidecarProcess(t *testing.T, ip string) int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(cmdline, []byte{0})
		if len(args) > 1 && bytes.HasSuffix(args[0], []byte("keyroll-probe")) && bytes.Contains(cmdline, []byte("--listen-ip="+ip+"\x00")) {
			return pid
		}
	}
	t.Fatalf("no keyroll-probe process listens on %s", ip)
	return 0
}

// peakRSS is a process's peak resident set (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// get asks for path on a connection of its own, as plainly as a probe does (HTTP/1.0: one
// request, then the server closes), and returns the status line's code and the body, or the error.
// Raw TCP rather than an http.Client per request: three thousand of those at once cost the test
// process itself more than the sidecar it measures.
func get(addr, path string) string {
	c, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.0\r\n\r\n"); err != nil {
		return "error: " + err.Error()
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "error: " + err.Error()
	}
	resp := string(b)
	status, _, _ := strings.Cut(resp, "\r\n")
	_, body, _ := strings.Cut(resp, "\r\n\r\n")
	if f := strings.Fields(status); len(f) >= 2 {
		return f[1] + " " + strings.TrimSpace(body)
	}
	return "malformed: " + resp
}

// refusal says whether get's outcome is a connection the sidecar closed without an answer (over
// its caps): closed at once, or reset.
func refusal(outcome string) bool {
	return outcome == "malformed: " || (strings.HasPrefix(outcome, "error: ") &&
		(strings.Contains(outcome, "connection reset") || strings.Contains(outcome, "broken pipe")))
}

// containers are a pod's containers' IDs and restart counts, the sidecar's included.
func containers(p *corev1.Pod) string {
	var out []string
	for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		out = append(out, fmt.Sprintf("%s=%s/%d", c.Name, c.ContainerID, c.RestartCount))
	}
	return strings.Join(out, " ")
}

// 3,000 concurrent requests, each on a connection of its own, to the probe sidecar beside a real
// Redis: the sidecar's peak resident memory stays under its container's limit, every request is
// either answered 200 (Redis is alive) or, over the sidecar's 4 connections at once from one
// address, refused (closed unanswered), every answer within the kubelet's probe timeout, and
// neither Redis nor the sidecar restarts (same container IDs, same restart counts, the pod Ready).
func TestProbeSidecarHoldsUnderFlood(t *testing.T) {
	ns := fw.Namespace(t, "flood")
	vc := fw.VaultConnection(t, "vault-flood", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(1))
	fw.WaitReady(t, rc, 3*time.Minute)
	pod := fw.RedisPods(t, rc)[0]
	var limit resource.Quantity
	for _, c := range pod.Spec.InitContainers {
		if c.Name == "probe" {
			limit = c.Resources.Limits[corev1.ResourceMemory]
		}
	}
	if limit.IsZero() {
		t.Fatalf("the probe sidecar has no memory limit: %+v", pod.Spec.InitContainers)
	}
	pid := sidecarProcess(t, pod.Status.PodIP)
	before := containers(&pod)
	t.Logf("sidecar pid %d, peak RSS before the flood %d KiB, limit %s", pid, peakRSS(t, pid)>>10, limit.String())

	const requests = 3000
	const deadline = 5 * time.Second // the kubelet's probe timeout (render: probeTimeout)
	addr := net.JoinHostPort(pod.Status.PodIP, "8081")
	codes := map[string]int{}
	var longest, longestRefusal time.Duration // of the answers; of the refusals, which 3,000 SYNs at once may delay in the kernel
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range requests {
		wg.Go(func() {
			<-start
			begin := time.Now()
			outcome := get(addr, "/live")
			took := time.Since(begin)
			mu.Lock()
			defer mu.Unlock()
			codes[outcome]++
			if !refusal(outcome) {
				longest = max(longest, took)
			} else {
				longestRefusal = max(longestRefusal, took)
			}
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	peak := peakRSS(t, pid)
	t.Logf("%d concurrent requests in %s: answers %v, longest answer %s, longest refusal %s; sidecar peak RSS %d KiB of a %s limit",
		requests, time.Since(began).Round(time.Millisecond), codes, longest.Round(time.Millisecond), longestRefusal.Round(time.Millisecond), peak>>10, limit.String())
	refused := 0
	for outcome, n := range codes {
		if refusal(outcome) {
			refused += n
		}
	}
	if codes["200 ok"] == 0 || codes["200 ok"]+refused != requests {
		t.Errorf("answers %v: want each 200 ok or refused unanswered, and some answered", codes)
	}
	if longest > deadline {
		t.Errorf("an answer took %s, longer than the kubelet's probe timeout %s", longest, deadline)
	}
	if peak >= limit.Value() {
		t.Errorf("the sidecar's peak RSS %d KiB reached its limit %s", peak>>10, limit.String())
	}

	// Long enough for a liveness failure to restart a container (6 probes 10 s apart would take
	// a minute; one OOM kill shows at once).
	time.Sleep(15 * time.Second)
	after := fw.RedisPods(t, rc)[0]
	if got := containers(&after); got != before || !framework.PodReady(&after) || after.UID != pod.UID {
		t.Errorf("containers before the flood %s, after %s (Ready %v)", before, got, framework.PodReady(&after))
	}
}
