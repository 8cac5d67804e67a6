package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/test/testground"
)

// The kubelet's probes of a healthy Redis are answered within their one-second timeout while
// another address holds 400 idle connections open and opens a new one for each the sidecar
// closes: the flood uses up its own address's slots only, the kubelet's connections, from another
// address, do not queue behind it, and the refusals are logged once, not once each.
func TestKubeletProbeAnsweredUnderIdleFlood(t *testing.T) {
	r, err := testground.StartRedis(t.TempDir())
	if err != nil {
		t.Fatalf("starting redis-server (apt-get install redis-server): %v", err)
	}
	defer r.Stop()
	if _, err := r.Do(r.AdminUser, r.AdminPassword, "ACL", "SETUSER", "keyroll-probe", "on", ">probe-pw", "+ping", "+info"); err != nil {
		t.Fatalf("adding the probe user: %v", err)
	}
	var logs syncBuffer
	p := &prober{redis: r.Addr(), user: "keyroll-probe", passwordFile: passwordFile(t, "probe-pw"), timeout: time.Second,
		fresh: time.Second, log: slog.New(slog.NewTextHandler(&logs, nil)), ready: redisnode.Ready, live: redisnode.Alive}
	addr := startServing(t, p, 256, 4)

	kubelet := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: from("127.0.0.3").DialContext}}
	probes := func(n int, when string) (took []time.Duration) { // n probes, a few periods' worth
		for i := range n {
			path := []string{"/live", "/ready"}[i%2]
			start := time.Now()
			resp, err := kubelet.Get("http://" + addr + path)
			took = append(took, time.Since(start).Round(time.Millisecond))
			if err != nil {
				t.Errorf("kubelet probe %d (%s) %s: %v; want 200 within 1s", i, path, when, err)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("kubelet probe %d (%s) %s: %s %q; want 200", i, path, when, resp.Status, body)
			}
			time.Sleep(200 * time.Millisecond)
		}
		return took
	}
	quiet := probes(4, "without a flood")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	opened, wait := flood(ctx, addr, "127.0.0.2", 400)
	stopFlood := func() { cancel(); wait() }
	defer stopFlood()
	for opened.Load() < 400 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	flooded := probes(10, "under the flood")
	stopFlood()
	t.Logf("kubelet probes without a flood: %v; under a flood of 400 idle connections (%d opened in all): %v, slowest %v",
		quiet, opened.Load(), flooded, slices.Max(flooded))
	if opened.Load() <= 400 {
		t.Errorf("the flood opened %d connections: the sidecar closed none of its 400 (want the ones over the cap closed at once)", opened.Load())
	}
	if n := strings.Count(logs.String(), "Refusing connections"); n != 1 {
		t.Errorf("%d lines say that connections were refused during the flood, want 1:\n%s", n, logs.String())
	}
}

// A connection over a cap is closed at once, without an answer: one address is served on at most
// perSource connections at once, all addresses on at most total; a connection that closes gives
// its slot back.
func TestConnectionsOverACapAreRefused(t *testing.T) {
	pass := func(context.Context, string, string, string, *tls.Config) error { return nil }
	p := &prober{passwordFile: passwordFile(t, "pw"), timeout: time.Second, fresh: time.Second, log: slog.New(slog.DiscardHandler), ready: pass, live: pass}
	addr := startServing(t, p, 6, 4)
	served := func(src string) (net.Conn, error) { // a connection from src, answered once and kept open
		c, err := from(src).Dial("tcp", addr)
		if err != nil {
			return nil, err // a reset can come before the dial returns
		}
		t.Cleanup(func() { _ = c.Close() })
		return c, get(c, "/live")
	}
	var first net.Conn
	for _, src := range []string{"127.0.0.4", "127.0.0.4", "127.0.0.4", "127.0.0.4", "127.0.0.5", "127.0.0.5"} {
		c, err := served(src)
		if err != nil {
			t.Fatalf("a connection from %s within the caps: %v", src, err)
		}
		if first == nil {
			first = c
		}
	}
	for _, c := range []struct{ src, cap string }{
		{"127.0.0.4", "a fifth connection from one address (4 per address)"},
		{"127.0.0.6", "a seventh connection in all (6 in all)"},
	} {
		if _, err := served(c.src); !refused(err) {
			t.Errorf("%s from %s: %v; want it closed at once without an answer", c.cap, c.src, err)
		}
	}

	_ = first.Close()
	deadline := time.Now().Add(2 * time.Second)
	for {
		_, err := served("127.0.0.4")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a connection from 127.0.0.4 after one of its 4 closed: %v; want its slot given back", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startServing serves p on a port of 127.0.0.1 with the given caps until the test ends, and
// returns the port's address.
func startServing(t *testing.T, p *prober, total, perSource int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, admit(l, total, perSource, p.log), p) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serving: %v", err)
		}
	})
	return l.Addr().String()
}

// flood holds n connections from src to addr open, sending nothing, and opens a new one for each
// that addr closes, until ctx ends. It counts the connections it opened; wait returns once they
// are all closed, after ctx ended. It runs in the sidecar's process, unlike a real flood (another
// pod's): it waits about a second before each new connection, so as not to take the sidecar's
// CPU, at random, so that its connections come steadily rather than all at once.
func flood(ctx context.Context, addr, src string, n int) (opened *atomic.Int64, wait func()) {
	opened = &atomic.Int64{}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := from(src).DialContext(ctx, "tcp", addr)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				opened.Add(1)
				stop := context.AfterFunc(ctx, func() { _ = c.Close() })
				_, _ = c.Read(make([]byte, 1)) // returns once the sidecar or ctx closes it
				stop()
				_ = c.Close()
				time.Sleep(500*time.Millisecond + rand.N(time.Second))
			}
		})
	}
	return opened, wg.Wait
}

// from dials from the loopback address src (any of 127.0.0.0/8 is this host's).
func from(src string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second}
}

// get sends GET path on c and reads a 200 answer, within a second.
func get(c net.Conn, path string) error {
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: probe\r\n\r\n", path); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

// refused tells whether err is that of a connection closed without an answer (not one that
// waited for an answer until its deadline).
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func passwordFile(t *testing.T, password string) string {
	file := filepath.Join(t.TempDir(), "probe-password")
	if err := os.WriteFile(file, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// syncBuffer is a log that the server's goroutines write while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
