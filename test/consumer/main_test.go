package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
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

// The consumer with -tls against a real redis-server that serves TLS only with a certificate for
// redis.test: it connects when ca.crt holds the CA that signed that certificate and the server
// name is redis.test, and otherwise counts a failure that says why (never the password).
func TestConsumerConnectsWithTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := newTestCA(t, "redis CA"), newTestCA(t, "another CA")
	certPEM, keyPEM, _, err := ca.IssueServer([]string{"redis.test"})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": ca.PEM}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port, err := testground.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// The plain port stays for the admin's commands; the consumer uses only the TLS one.
	r, err := testground.StartRedis(dir, "--tls-port", strconv.Itoa(port), "--tls-auth-clients", "no",
		"--tls-cert-file", filepath.Join(dir, "tls.crt"), "--tls-key-file", filepath.Join(dir, "tls.key"), "--tls-ca-cert-file", filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	if _, err := r.Do(r.AdminUser, r.AdminPassword, "ACL", "SETUSER", "app-1", "on", ">pw-app-1", "~*", "+@all"); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	for name, tc := range map[string]struct {
		caPEM      []byte // nil: no ca.crt
		serverName string
		wantErr    string // empty: SET and GET succeed
	}{
		"the CA that signed the certificate":    {caPEM: ca.PEM, serverName: "redis.test"},
		"a bundle with that CA among others":    {caPEM: slices.Concat(other.PEM, ca.PEM), serverName: "redis.test"},
		"another CA":                            {caPEM: other.PEM, serverName: "redis.test", wantErr: "certificate signed by unknown authority"},
		"another server name":                   {caPEM: ca.PEM, serverName: "other.test", wantErr: "certificate is valid for redis.test, not other.test"},
		"no server name: the host of -redis":    {caPEM: ca.PEM, wantErr: "cannot validate certificate for 127.0.0.1"},
		"no ca.crt":                             {serverName: "redis.test", wantErr: "reading the CA bundle"},
		"a ca.crt that holds no certificate":    {caPEM: []byte("not PEM"), serverName: "redis.test", wantErr: "parsing the CA bundle"},
		"a ca.crt that holds only a server key": {caPEM: keyPEM, serverName: "redis.test", wantErr: "parsing the CA bundle"},
	} {
		t.Run(name, func(t *testing.T) {
			c := tlsConsumer(t, addr, tc.serverName)
			writeCA(t, c.caFile, tc.caPEM)
			got, ok := setGet(c, "1")
			s := c.snapshot()
			if tc.wantErr == "" {
				if !ok || got != "1" || s.OK != 2 || s.Failed != 0 || s.Connects != 1 {
					t.Fatalf("GET %q, %+v; want SET and GET on one connection", got, s)
				}
				return
			}
			if ok || s.OK != 0 || s.Failed != 1 || s.Connects != 0 || !strings.Contains(s.LastError, tc.wantErr) {
				t.Fatalf("%+v; want one failure with %q", s, tc.wantErr)
			}
			if strings.Contains(s.LastError, "pw-app-1") || strings.Contains(s.LastError, string(keyPEM)) {
				t.Fatalf("the error tells a secret: %s", s.LastError)
			}
		})
	}

	// A ca.crt that changes (a renewed CA in the Secret) is taken at the next connection.
	c := tlsConsumer(t, addr, "redis.test")
	writeCA(t, c.caFile, other.PEM)
	if _, ok := setGet(c, "1"); ok {
		t.Fatalf("connected with another CA: %+v", c.snapshot())
	}
	writeCA(t, c.caFile, ca.PEM)
	if got, ok := setGet(c, "2"); !ok || got != "2" {
		t.Fatalf("the new ca.crt not taken: GET %q, %+v", got, c.snapshot())
	}
}

// tlsConsumer is a consumer with -tls, the credential app-1 and ca.crt in its credentials directory
// (written by writeCA).
func tlsConsumer(t *testing.T, addr, serverName string) *consumer {
	t.Helper()
	creds := filepath.Join(t.TempDir(), "credentials")
	writeCredential(t, creds, "app-1")
	c := &consumer{addr: addr, dir: creds, key: "consumer:test", timeout: 2 * time.Second,
		useTLS: true, caFile: filepath.Join(creds, "ca.crt"), serverName: serverName}
	c.reloadCredentials()
	return c
}

// writeCA writes the CA bundle file (nil: removes it).
func writeCA(t *testing.T, path string, caPEM []byte) {
	t.Helper()
	if caPEM == nil {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return
	}
	if err := os.WriteFile(path, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
}

// setGet runs one round of the consumer's loop, SET value then GET, and says whether both
// succeeded.
func setGet(c *consumer, value string) (string, bool) {
	var got string
	ok := c.do("SET", func() error {
		_, err := c.command("SET", c.key, value)
		return err
	}) && c.do("GET", func() error {
		var err error
		got, err = c.command("GET", c.key)
		return err
	})
	return got, ok
}

// newTestCA is a CA of the test's own.
func newTestCA(t *testing.T, name string) *testground.TestCA {
	t.Helper()
	ca, err := testground.NewTestCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
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
