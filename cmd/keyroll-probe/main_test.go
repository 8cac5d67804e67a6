package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyroll/keyroll/redisnode"
)

// A probe that fails answers 503 with why, and neither its answer nor its log holds the password;
// the log says each change of verdict once.
func TestAFailedProbeSaysWhyWithoutThePassword(t *testing.T) {
	const password = "s3cret-probe-password"
	file := filepath.Join(t.TempDir(), "probe-password")
	if err := os.WriteFile(file, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0") // a port nothing answers on once closed
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	var logs bytes.Buffer
	p := &prober{redis: addr, user: "keyroll-probe", passwordFile: file, timeout: time.Second, fresh: time.Second,
		log: slog.New(slog.NewTextHandler(&logs, nil)), ready: redisnode.Ready, live: redisnode.Alive}
	srv := httptest.NewServer(p.handler())
	defer srv.Close()

	for _, path := range []string{"/ready", "/live", "/live"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "connection refused") {
			t.Errorf("%s with no Redis: %s %q; want 503 saying the connection was refused", path, resp.Status, body)
		}
		if strings.Contains(string(body), password) {
			t.Errorf("%s answered the password: %q", path, body)
		}
	}
	if strings.Contains(logs.String(), password) {
		t.Errorf("the log holds the password:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "Probe fails"); n != 2 {
		t.Errorf("%d failures logged for two probes failing the same way (one of them twice), want 2:\n%s", n, logs.String())
	}

	resp, err := http.Post(srv.URL+"/ready", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ready: %s, want 405", resp.Status)
	}
}

// Under a flood of concurrent requests, on as many connections, the sidecar runs one check at a
// time (a handful in all: a verdict answers for a second) and answers every request, right; a
// check that hangs gets each request a 503 within the request's deadline, not a hung connection.
func TestAFloodRunsOneCheckAtATime(t *testing.T) {
	file := filepath.Join(t.TempDir(), "probe-password")
	if err := os.WriteFile(file, []byte("pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var running, most, checks atomic.Int32
	hang := make(chan struct{})
	slow := func(ctx context.Context, _, _, _ string, _ *tls.Config) error {
		defer running.Add(-1)
		if n := running.Add(1); n > most.Load() {
			most.Store(n)
		}
		checks.Add(1)
		select {
		case <-hang:
			<-ctx.Done()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
			return nil
		}
	}
	p := &prober{passwordFile: file, timeout: 500 * time.Millisecond, fresh: time.Second, log: slog.New(slog.DiscardHandler), ready: slow, live: slow}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := p.server()
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

	flood := func(n int) (codes map[int]int, longest time.Duration) {
		codes = map[int]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
				start := time.Now()
				resp, err := c.Get("http://" + l.Addr().String() + "/live")
				took := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				longest = max(longest, took)
				if err != nil {
					codes[-1]++
					return
				}
				_ = resp.Body.Close()
				codes[resp.StatusCode]++
			})
		}
		wg.Wait()
		return codes, longest
	}
	codes, longest := flood(500)
	if codes[http.StatusOK] != 500 || most.Load() != 1 || checks.Load() > 3 {
		t.Errorf("500 requests: answers %v, %d checks, at most %d at once (longest answer %s); want 500 OK, one check at a time, a few in all", codes, checks.Load(), most.Load(), longest)
	}

	close(hang)
	time.Sleep(time.Second) // the verdict of the flood is no longer fresh
	codes, longest = flood(50)
	if codes[http.StatusServiceUnavailable] != 50 || longest > 3*time.Second {
		t.Errorf("50 requests to a hung check: answers %v, longest %s; want 50 times 503 within the deadline", codes, longest)
	}
}
