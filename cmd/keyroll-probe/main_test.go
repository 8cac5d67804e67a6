package main

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	p := &prober{redis: addr, user: "keyroll-probe", passwordFile: file, timeout: time.Second,
		log: slog.New(slog.NewTextHandler(&logs, nil))}
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
