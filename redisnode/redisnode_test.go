package redisnode_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/test/testground"
)

// These tests run the client against a real redis-server (Debian's 7.0): what they check is what
// Redis does with keyroll's commands.

func startRedis(t *testing.T) (*testground.Redis, *redisnode.Client) {
	t.Helper()
	r, err := testground.StartRedis(t.TempDir())
	if err != nil {
		t.Fatalf("starting redis-server (apt-get install redis-server): %v", err)
	}
	t.Cleanup(r.Stop)
	n := redisnode.New(r.Addr(), r.AdminUser, r.AdminPassword, nil)
	t.Cleanup(func() { _ = n.Close() })
	return r, n
}

func hash(p string) string {
	s := sha256.Sum256([]byte(p))
	return hex.EncodeToString(s[:])
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestSetUserAcceptsAndDelUserCutsOff(t *testing.T) {
	r, n := startRedis(t)
	c := ctx(t)
	u := redisnode.User{Name: "app", PasswordHash: hash("secret-1"), Rules: []string{"~app:*", "+@read", "+@write", "-@dangerous"}}
	if err := n.SetUser(c, u); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.Accepts(c, "app", "secret-1"); err != nil || !ok {
		t.Fatalf("Accepts with the right password: %v, %v", ok, err)
	}
	if ok, err := n.Accepts(c, "app", "wrong"); err != nil || ok {
		t.Fatalf("Accepts with a wrong password: %v, %v", ok, err)
	}
	// The user cannot PING (no @connection), and still counts as accepted.
	if _, err := r.Do("app", "secret-1", "PING"); err == nil {
		t.Fatal("the test's rules should forbid PING")
	}
	if out, err := r.Do("app", "secret-1", "SET", "app:1", "x"); err != nil || out != "OK" {
		t.Fatalf("SET app:1 as app: %q, %v", out, err)
	}

	// A connection authenticated as the user stays open through a SetUser of the same user (new
	// password, same rules)...
	conn := authedConn(t, r.Addr(), "app", "secret-1")
	u.PasswordHash = hash("secret-2")
	if err := n.SetUser(c, u); err != nil {
		t.Fatal(err)
	}
	if err := conn.get("app:1"); err != nil {
		t.Fatalf("a connection of the user after SetUser: %v", err)
	}
	if ok, _ := n.Accepts(c, "app", "secret-1"); ok {
		t.Fatal("SetUser keeps only the given password; the old one still logs in")
	}
	// ... and is closed by DelUsers.
	if err := n.DelUsers(c, "app", "never-there"); err != nil {
		t.Fatal(err)
	}
	if err := conn.get("app:1"); err == nil {
		t.Fatal("a connection of a deleted user still works")
	}
	if ok, _ := n.Accepts(c, "app", "secret-2"); ok {
		t.Fatal("a deleted user still logs in")
	}
	users, err := n.Users(c)
	if err != nil || slices.Contains(users, "app") {
		t.Fatalf("users after DelUsers: %v, %v", users, err)
	}
}

func TestRefusedRuleNamesTheRuleAndChangesNothing(t *testing.T) {
	_, n := startRedis(t)
	c := ctx(t)
	u := redisnode.User{Name: "app", PasswordHash: hash("p"), Rules: []string{"~*", "+@all"}}
	if err := n.SetUser(c, u); err != nil {
		t.Fatal(err)
	}
	err := n.CheckRules(c, []string{"~app:*", "+@read", "+@nosuchcategory"})
	var re *redisnode.RuleError
	if !errors.As(err, &re) || re.Rule != "+@nosuchcategory" || re.Message == "" {
		t.Fatalf("CheckRules of an unknown category: %v", err)
	}
	t.Logf("Redis says: %v", err)
	if err := n.CheckRules(c, []string{"~app:*", "+@read", "+@write", "-@dangerous"}); err != nil {
		t.Fatalf("CheckRules of valid rules: %v", err)
	}
	users, _ := n.Users(c)
	if slices.Contains(users, "keyroll-rule-check") {
		t.Fatal("the scratch user of CheckRules was left behind")
	}
	// SetUser with a bad rule changes nothing: the user keeps its password.
	u.Rules = []string{"~*", "+nosuchcommand"}
	u.PasswordHash = hash("other")
	if err := n.SetUser(c, u); !errors.As(err, &re) || re.Rule != "+nosuchcommand" {
		t.Fatalf("SetUser with an unknown command: %v", err)
	}
	if ok, _ := n.Accepts(c, "app", "p"); !ok {
		t.Fatal("a refused SetUser changed the user")
	}
}

func TestReplicationStateOfAPrimaryAndItsReplica(t *testing.T) {
	r, n := startRedis(t)
	c := ctx(t)
	if err := n.SetUser(c, redisnode.User{Name: "repl", PasswordHash: hash("rp"), Rules: []string{"+psync", "+replconf", "+ping"}}); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(r.Addr())
	dir := t.TempDir()
	replica, err := testground.StartRedis(dir, "--replicaof", "127.0.0.1", port, "--masteruser", "repl", "--masterauth", "rp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(replica.Stop)
	rn := redisnode.New(replica.Addr(), replica.AdminUser, replica.AdminPassword, nil)
	defer rn.Close()
	deadline := time.Now().Add(20 * time.Second)
	var st redisnode.Replication
	for time.Now().Before(deadline) {
		if st, err = rn.Replication(c); err == nil && st.LinkUp && !st.SyncInProgress {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st.Role != "slave" || !st.LinkUp || st.SyncInProgress {
		t.Fatalf("replica: %+v, %v", st, err)
	}
	p, err := n.Replication(c)
	if err != nil || p.Role != "master" || p.ConnectedReplicas != 1 || p.FullSyncs != 1 {
		t.Fatalf("primary: %+v, %v", p, err)
	}
}

func TestUnreachableNode(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	n := redisnode.New(addr, "admin", "x", nil)
	defer n.Close()
	_, err = n.Users(ctx(t))
	if err == nil || !redisnode.Unreachable(err) {
		t.Fatalf("Users on a closed port: %v (unreachable: %v)", err, redisnode.Unreachable(err))
	}
}

func TestMain(m *testing.M) { os.Exit(m.Run()) }

// authedConn is one connection authenticated as username, kept open: a command on it fails once
// Redis closes it (reconnecting would need the old password, which the test changes).
type authed struct{ c *redis.Client }

func authedConn(t *testing.T, addr, username, password string) authed {
	c := redis.NewClient(&redis.Options{Addr: addr, Username: username, Password: password, Protocol: 2,
		DisableIdentity: true, PoolSize: 1, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Get(context.Background(), "app:1").Err(); err != nil {
		t.Fatalf("connecting as %s: %v", username, err)
	}
	return authed{c}
}

func (a authed) get(key string) error { return a.c.Get(context.Background(), key).Err() }

// A node that refuses the connection's user (wrong password: WRONGPASS; a command the user may
// not run: NOPERM) says so through LoginRefused, whatever wraps the error; an unreachable node
// does not. ACLList lists every user, the default one included; DisableUser turns a user off.
func TestLoginRefusedAndTheACL(t *testing.T) {
	r, n := startRedis(t)
	c := ctx(t)
	wrong := redisnode.New(r.Addr(), r.AdminUser, "not-the-password", nil)
	defer wrong.Close()
	_, err := wrong.ACLList(c)
	if !redisnode.LoginRefused(err) {
		t.Errorf("a wrong password: LoginRefused(%v) false", err)
	}
	if err := n.SetUser(c, redisnode.User{Name: "app", PasswordHash: hash("p"), Rules: []string{"~*", "+get"}}); err != nil {
		t.Fatal(err)
	}
	app := redisnode.New(r.Addr(), "app", "p", nil)
	defer app.Close()
	if _, err := app.ACLList(c); !redisnode.LoginRefused(err) {
		t.Errorf("a command the user may not run: LoginRefused(%v) false", err)
	}
	gone := redisnode.New("127.0.0.1:1", "x", "y", nil)
	defer gone.Close()
	if _, err := gone.ACLList(c); err == nil || redisnode.LoginRefused(err) {
		t.Errorf("an unreachable node: LoginRefused(%v) true", err)
	}
	lines, err := n.ACLList(c)
	if err != nil || len(lines) != 3 || !strings.HasPrefix(lines[1], "user app on ") || !strings.Contains(lines[1], " #"+hash("p")+" ") || !strings.HasPrefix(lines[2], "user default off ") {
		t.Fatalf("ACL LIST %q, %v", lines, err)
	}
	if err := n.DisableUser(c, "app"); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.Accepts(c, "app", "p"); err != nil || ok {
		t.Errorf("after DisableUser the user logs in: %v, %v", ok, err)
	}
}

func TestParseClientList(t *testing.T) {
	out := "id=3 addr=10.0.0.7:51234 laddr=10.0.0.1:6379 fd=8 name= age=12 idle=0 flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 qbuf=26 qbuf-free=20448 argv-mem=10 multi-mem=0 rbs=1024 rbp=0 obl=0 oll=0 omem=0 tot-mem=22298 events=r cmd=client|list user=app-1 redir=-1 resp=2\n" +
		"id=4 addr=10.0.0.8:40000 laddr=10.0.0.1:6379 fd=9 name= age=1 idle=1 flags=S db=0 cmd=replconf user=keyroll-replication resp=2\n"
	got := redisnode.ParseClientList(out)
	want := []redisnode.Conn{{User: "app-1", Addr: "10.0.0.7:51234"}, {User: "keyroll-replication", Addr: "10.0.0.8:40000"}}
	if !slices.Equal(got, want) {
		t.Errorf("ParseClientList: %+v, want %+v", got, want)
	}
}

// A client may name its connection with any number of bytes (CLIENT SETNAME, which the
// application user may run), and CLIENT LIST repeats every name: keyroll reads such a reply only
// up to its bound, refuses it with ErrReplyTooLarge, and the node and the next exchange are fine.
func TestHugeClientNamesAreRefusedNotRead(t *testing.T) {
	r, n := startRedis(t)
	c := ctx(t)
	if conns, err := n.Clients(c); err != nil || len(conns) == 0 {
		t.Fatalf("CLIENT LIST before the names: %v, %v", conns, err)
	}
	name := strings.Repeat("n", 3<<20) // three of them are over the bound
	for i := range 3 {
		a := redis.NewClient(&redis.Options{Addr: r.Addr(), Username: r.AdminUser, Password: r.AdminPassword,
			Protocol: 2, DisableIdentity: true, PoolSize: 1, MaxRetries: -1})
		t.Cleanup(func() { _ = a.Close() })
		if err := a.Do(c, "CLIENT", "SETNAME", name+fmt.Sprint(i)).Err(); err != nil {
			t.Fatalf("CLIENT SETNAME of 3 MiB: %v", err)
		}
	}
	start := time.Now()
	_, err := n.Clients(c)
	if !errors.Is(err, redisnode.ErrReplyTooLarge) {
		t.Fatalf("CLIENT LIST with 9 MiB of names: %v, want ErrReplyTooLarge", err)
	}
	if d := time.Since(start); d > redisnode.Timeout {
		t.Errorf("refused after %s", d)
	}
	if _, err := n.ACLList(c); err != nil {
		t.Fatalf("the next exchange after a refused reply: %v", err)
	}
}
