package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/keyroll/keyroll/test/consumer/stats"
	"github.com/keyroll/keyroll/test/testground"
)

// The consumer against a real redis-server: it counts successful commands with a working
// credential, takes a changed credential from its files without a failed command, and counts the
// failures once its user is gone.
func TestConsumerCountsCommandsAndFollowsTheCredential(t *testing.T) {
	dir := t.TempDir()
	r, err := testground.StartRedis(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	for _, u := range []string{"app-1", "app-2"} {
		if _, err := r.Do(r.AdminUser, r.AdminPassword, "ACL", "SETUSER", u, "on", ">pw-"+u, "~*", "+@all"); err != nil {
			t.Fatal(err)
		}
	}
	creds := filepath.Join(dir, "credentials")
	writeCredential(t, creds, "app-1")
	c := &consumer{addr: r.Addr(), dir: creds, key: "consumer:test", interval: 10 * time.Millisecond, timeout: 2 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.loop(ctx); close(done) }()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-done
		}
	}()

	s := waitStats(t, c, func(s stats.Stats) bool { return s.OK >= 20 })
	if s.Failed != 0 || s.User != "app-1" || s.Connects != 1 {
		t.Fatalf("with a working credential: %+v", s)
	}
	writeCredential(t, creds, "app-2")
	s = waitStats(t, c, func(s stats.Stats) bool { return s.User == "app-2" && s.OK >= 40 })
	if s.Failed != 0 || s.CredentialReloads != 1 || s.Connects != 2 {
		t.Fatalf("after the credential changed: %+v", s)
	}
	if _, err := r.Do(r.AdminUser, r.AdminPassword, "ACL", "DELUSER", "app-2"); err != nil {
		t.Fatal(err)
	}
	s = waitStats(t, c, func(s stats.Stats) bool { return s.Failed >= 3 })
	if s.LastError == "" || s.LastFailure == "" {
		t.Fatalf("failures without a reason: %+v", s)
	}
	if f := s.Failures; len(f) < 3 || (f[0].Op != "SET" && f[0].Op != "GET") || f[0].User != "app-2" || f[0].Error == "" || f[0].At == "" {
		t.Fatalf("failures not recorded one by one: %+v", s.Failures)
	}

	// Stopped (SIGTERM), it writes its final counters, every command counted.
	cancel()
	<-done
	stopped = true
	final := filepath.Join(dir, "final")
	c.writeFinal(final)
	b, err := os.ReadFile(final)
	if err != nil {
		t.Fatal(err)
	}
	var got stats.Stats
	if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(got, c.stats) || got.OK < 40 {
		t.Fatalf("final counters %s (%v), want %+v", b, err, c.stats)
	}
}

// writeCredential lays the files out as the kubelet does in a Secret volume: a new directory
// ..<timestamp> with both files, ..data switched to it by a rename, and username and password
// as links through ..data.
func writeCredential(t *testing.T, dir, user string) {
	t.Helper()
	snapshot := fmt.Sprintf("..%d", time.Now().UnixNano())
	if err := os.MkdirAll(filepath.Join(dir, snapshot), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"username": user, "password": "pw-" + user} {
		if err := os.WriteFile(filepath.Join(dir, snapshot, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(snapshot, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// waitStats reads /stats until ok holds.
func waitStats(t *testing.T, c *consumer, ok func(stats.Stats) bool) stats.Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec := httptest.NewRecorder()
		c.serveStats(rec, httptest.NewRequest("GET", "/stats", nil))
		var s stats.Stats
		if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
			t.Fatal(err)
		}
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats never got there: %+v", s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
