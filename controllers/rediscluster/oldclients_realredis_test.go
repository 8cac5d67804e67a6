package rediscluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/test/testground"
)

// The clients that hold a retirement come from a real redis-server here: thousands of
// connections as the old user, each from an address of its own, read back with keyroll's own
// CLIENT LIST. The reconciler's fake nodes then report what the real one did, so the condition,
// the events and status.oldUserClients are built from what Redis really says (before the bound
// on named clients, ~470 addresses made the message pass 32 KiB and every status write failed).
func TestClientsOfARealRedisKeepTheStatusWritable(t *testing.T) {
	want := clientAddresses(t, 2000)
	r, err := testground.StartRedis(t.TempDir())
	if err != nil {
		t.Fatalf("starting redis-server (apt-get install redis-server): %v", err)
	}
	t.Cleanup(r.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := redisnode.New(r.Addr(), r.AdminUser, r.AdminPassword, nil)
	defer func() { _ = node.Close() }()

	h := newHarness(t, cluster())
	rc := h.settle(t)
	old := rc.Status.Credential.Username
	const password = "test-only-password"
	if err := node.SetUser(ctx, redisnode.User{Name: old, PasswordHash: render.HashPassword(password), Rules: []string{"~*", "+@all"}}); err != nil {
		t.Fatal(err)
	}
	logInFrom(ctx, t, r.Addr(), old, password, want)
	conns, err := node.Clients(ctx)
	if err != nil {
		t.Fatalf("keyroll's CLIENT LIST of %d clients: %v", want, err)
	}
	addrs := map[string]bool{}
	for _, c := range conns {
		if ip, _, err := net.SplitHostPort(c.Addr); err == nil && c.User == old {
			addrs[ip] = true
		}
	}
	if len(addrs) != want {
		t.Fatalf("Redis listed %d addresses logged in as %s, want %d", len(addrs), old, want)
	}
	h.redis.SetClients(nodeAddr(0), conns...)

	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(ctx, rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	cond := condition(rc, v1beta1.ConditionLeasesRevoked)
	if cond == nil || cond.Reason != v1beta1.ReasonClientsStillLoggedIn {
		t.Fatalf("LeasesRevoked %+v", cond)
	}
	t.Logf("%d clients of a real Redis: a message of %d bytes, status.oldUserClients of %d", want, len(cond.Message), len(rc.Status.OldUserClients))
	if more := fmt.Sprintf("and %d more", want-maxNamedClients); len(cond.Message) > 4096 || !strings.Contains(cond.Message, more) {
		t.Errorf("a message of %d bytes for %d clients, want under 4 KiB saying %q: %.300s", len(cond.Message), want, more, cond.Message)
	}
	if len(rc.Status.OldUserClients) != maxOldUserClients {
		t.Errorf("status.oldUserClients holds %d, want %d", len(rc.Status.OldUserClients), maxOldUserClients)
	}
	for _, c := range rc.Status.OldUserClients {
		if !addrs[c.Address] || c.User != old {
			t.Errorf("status.oldUserClients has %+v, which Redis did not list as %s", c, old)
		}
	}
	for len(h.events.Events) > 0 {
		if e := <-h.events.Events; len(e) > 4096 {
			t.Errorf("an event of %d bytes", len(e))
		}
	}
}

// clientAddresses is how many connections the test opens: want, or fewer where the limit on
// open files would not hold them twice (once here, once in redis-server), but never fewer than
// 600, past the ~470 that broke the message. It raises this process's soft limit to the hard
// one first; having called Setrlimit, Go starts redis-server with the raised limit too.
func clientAddresses(t *testing.T, want int) int {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < 856 {
		t.Fatalf("the limit on open files is %d: the test needs 856 for 600 connections", lim.Cur)
	}
	return int(min(uint64(want), lim.Cur-256)) // room for the test's other files and Redis's own
}

// logInFrom opens n connections to the Redis at addr, logged in as user, each from its own
// loopback address (127.0.1.1, 127.0.1.2, ...: Linux answers for the whole of 127.0.0.0/8). They
// stay open until the test ends.
func logInFrom(ctx context.Context, t *testing.T, addr, user, password string, n int) {
	t.Helper()
	conns := make([]net.Conn, n)
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	})
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i := range n {
		g.Go(func() error {
			from := &net.TCPAddr{IP: net.IPv4(127, 0, byte(1+i/250), byte(1+i%250))}
			d := net.Dialer{LocalAddr: from, Timeout: 10 * time.Second}
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			conns[i] = c
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "*3\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(user), user, len(password), password)
			reply, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || reply != "+OK\r\n" {
				return fmt.Errorf("AUTH from %s: %q, %v", from.IP, reply, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("logging in %d clients: %v", n, err)
	}
}
