// Package redisnodetest fakes Redis nodes for unit tests of code that uses redisnode: each node is
// a map of users, with Redis's rules for what SETUSER, DELUSER and a login do. It checks no rule
// but those the test says Redis refuses. Integration tests use real Redis pods instead.
package redisnodetest

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keyroll/keyroll/redisnode"
)

// Fake is a set of fake Redis nodes by address. A node comes into being when first dialled, with
// the admin user that dialled it (as if it had loaded an aclfile with that user), unless Absent.
type Fake struct {
	mu    sync.Mutex
	nodes map[string]*Node
	// Refused are the rules every node refuses, with Redis's message.
	Refused map[string]string
	// Unreachable addresses refuse connections.
	Unreachable map[string]bool
	// RefusesLogin addresses take ACL SETUSER but then let no one log in on a connection of
	// its own (Accepts answers false, as Redis does with WRONGPASS).
	RefusesLogin map[string]bool
	// KeepsDeleted addresses answer ACL DELUSER without removing any user.
	KeepsDeleted map[string]bool
	// BeforeSetUser, when set, runs as a node takes ACL SETUSER, before it changes the user:
	// the node's address and the user as sent.
	BeforeSetUser func(addr string, u redisnode.User)
	// Commands counts every command sent to any node.
	Commands int
	// Offsets are the nodes' replication offsets, by address (0 when not set).
	Offsets map[string]int64
	// masterOf is the primary each replica replicates from, by address; a node without one is a
	// primary.
	masterOf map[string]string
	// clients are the client connections of each node, by address (SetClients).
	clients map[string][]redisnode.Conn
	// ClientsErr, by address, is the error of a node's CLIENT LIST (a reply over the bound).
	ClientsErr map[string]error
}

// SetClients says which client connections the node at addr has (CLIENT LIST); a user it deletes
// closes those logged in as that user.
func (f *Fake) SetClients(addr string, conns ...redisnode.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.clients == nil {
		f.clients = map[string][]redisnode.Conn{}
	}
	f.clients[addr] = conns
}

// ReplicateFrom makes the nodes at replicas replicas of the node at primary.
func (f *Fake) ReplicateFrom(primary string, replicas ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range replicas {
		f.masterOf[r] = primary
	}
}

// ReplicaOfNoOne makes the node at addr a primary.
func (f *Fake) ReplicaOfNoOne(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.masterOf, addr)
}

// PrimaryOf is the address the node at addr replicates from ("" for a primary).
func (f *Fake) PrimaryOf(addr string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.masterOf[addr]
}

// Node is one fake node's users.
type Node struct {
	Users map[string]redisnode.User
	// DefaultOn says the default user was turned on (without a password).
	DefaultOn bool
	// Reloads counts the node's certificate reloads (ReloadCertificate).
	Reloads int
}

// AddUser adds or changes a user on the node at addr outside keyroll (by hand, or an
// application user with ACL rights); with defaultOn, it turns the default user on instead.
func (f *Fake) AddUser(addr string, u redisnode.User, defaultOn bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[addr]
	if defaultOn {
		n.DefaultOn = true
		return
	}
	n.Users[u.Name] = u
}

// replyError is an error reply of a node, as go-redis returns one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// New returns a Fake with no nodes.
func New() *Fake {
	return &Fake{nodes: map[string]*Node{}, Refused: map[string]string{}, Unreachable: map[string]bool{},
		RefusesLogin: map[string]bool{}, KeepsDeleted: map[string]bool{}, masterOf: map[string]string{}, Offsets: map[string]int64{}}
}

// Dial is a redisnode.Dialer of the fake's nodes.
func (f *Fake) Dial(addr, username, password string, _ *tls.Config) redisnode.Node {
	return &conn{f: f, addr: addr, user: username, pass: password}
}

// Users are the names of the users of the node at addr (nil when it has never been dialled).
func (f *Fake) Users(addr string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[addr]
	if n == nil {
		return nil
	}
	var out []string
	for name := range n.Users {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// UserSet is a copy of the users of the node at addr, names, password hashes and rules (nil
// when it has never been dialled).
func (f *Fake) UserSet(addr string) map[string]redisnode.User {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[addr]
	if n == nil {
		return nil
	}
	out := make(map[string]redisnode.User, len(n.Users))
	for name, u := range n.Users {
		u.Rules = slices.Clone(u.Rules)
		out[name] = u
	}
	return out
}

// Restart forgets every user of the node at addr except those given: a Redis that started again
// from an aclfile with them.
func (f *Fake) Restart(addr string, users ...redisnode.User) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := &Node{Users: map[string]redisnode.User{}}
	for _, u := range users {
		n.Users[u.Name] = u
	}
	f.nodes[addr] = n
}

// Accepts says whether the node at addr lets username log in with password.
func (f *Fake) Accepts(addr, username, password string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[addr]
	return n != nil && n.accepts(username, password)
}

func (n *Node) accepts(username, password string) bool {
	u, ok := n.Users[username]
	return ok && u.PasswordHash == Hash(password)
}

// Hash is the SHA-256 of a password, hex.
func Hash(password string) string {
	s := sha256.Sum256([]byte(password))
	return hex.EncodeToString(s[:])
}

type conn struct {
	f                *Fake
	addr, user, pass string
}

// node is the connection's node after a login as the connection's user.
func (c *conn) node() (*Node, error) {
	c.f.Commands++
	if c.f.Unreachable[c.addr] {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("connection refused")}
	}
	n := c.f.nodes[c.addr]
	if n == nil {
		n = &Node{Users: map[string]redisnode.User{c.user: {Name: c.user, PasswordHash: Hash(c.pass)}}}
		c.f.nodes[c.addr] = n
	}
	if !n.accepts(c.user, c.pass) {
		// wrapped, as the real client wraps what the node answers
		return nil, fmt.Errorf("on %s: %w", c.addr, replyError("WRONGPASS invalid username-password pair or user is disabled"))
	}
	return n, nil
}

func (c *conn) ACLList(context.Context) ([]string, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	n, err := c.node()
	if err != nil {
		return nil, err
	}
	out := []string{"user default off resetchannels -@all"}
	if n.DefaultOn {
		out[0] = "user default on nopass ~* &* +@all"
	}
	var names []string
	for name := range n.Users {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		u := n.Users[name]
		out = append(out, strings.TrimSpace(fmt.Sprintf("user %s on #%s %s", name, u.PasswordHash, strings.Join(u.Rules, " "))))
	}
	return out, nil
}

func (c *conn) DisableUser(_ context.Context, name string) error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	n, err := c.node()
	if err != nil {
		return err
	}
	if name == "default" {
		n.DefaultOn = false
	} else if _, ok := n.Users[name]; ok {
		n.Users[name] = redisnode.User{Name: name}
	}
	return nil
}

func (c *conn) refused(rules []string) error {
	for _, r := range rules {
		if msg, ok := c.f.Refused[r]; ok {
			return &redisnode.RuleError{Rule: r, Message: msg}
		}
	}
	return nil
}

func (c *conn) SetUser(_ context.Context, u redisnode.User) error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	n, err := c.node()
	if err != nil {
		return err
	}
	if err := c.refused(u.Rules); err != nil {
		return err
	}
	if c.f.BeforeSetUser != nil {
		c.f.BeforeSetUser(c.addr, u)
	}
	n.Users[u.Name] = u
	return nil
}

func (c *conn) Clients(context.Context) ([]redisnode.Conn, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	if _, err := c.node(); err != nil {
		return nil, err
	}
	if err := c.f.ClientsErr[c.addr]; err != nil {
		return nil, err
	}
	return slices.Clone(c.f.clients[c.addr]), nil
}

func (c *conn) DelUsers(_ context.Context, names ...string) error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	if c.f.clients != nil {
		c.f.clients[c.addr] = slices.DeleteFunc(slices.Clone(c.f.clients[c.addr]), func(k redisnode.Conn) bool { return slices.Contains(names, k.User) })
	}
	n, err := c.node()
	if err != nil {
		return err
	}
	if c.f.KeepsDeleted[c.addr] {
		return nil
	}
	for _, name := range names {
		delete(n.Users, name)
	}
	return nil
}

func (c *conn) CheckRules(_ context.Context, rules []string) error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	if _, err := c.node(); err != nil {
		return err
	}
	return c.refused(rules)
}

func (c *conn) Accepts(_ context.Context, username, password string) (bool, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	n, err := c.node()
	if err != nil {
		return false, err
	}
	return !c.f.RefusesLogin[c.addr] && n.accepts(username, password), nil
}

func (c *conn) Replication(context.Context) (redisnode.Replication, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	if _, err := c.node(); err != nil {
		return redisnode.Replication{}, err
	}
	if m := c.f.masterOf[c.addr]; m != "" {
		host, port := splitAddr(m)
		return redisnode.Replication{Role: "slave", MasterHost: host, MasterPort: port, LinkUp: c.f.masterOf[m] == "", Offset: c.f.Offsets[c.addr]}, nil
	}
	st := redisnode.Replication{Role: "master", Offset: c.f.Offsets[c.addr]}
	for r, m := range c.f.masterOf {
		if m == c.addr {
			host, port := splitAddr(r)
			st.Replicas = append(st.Replicas, redisnode.Replica{IP: host, Port: port, State: "online", Offset: c.f.Offsets[r]})
		}
	}
	slices.SortFunc(st.Replicas, func(a, b redisnode.Replica) int { return strings.Compare(a.IP, b.IP) })
	st.ConnectedReplicas = len(st.Replicas)
	return st, nil
}

func (c *conn) Failover(_ context.Context, host string, port int, _ time.Duration) error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	if _, err := c.node(); err != nil {
		return err
	}
	target := net.JoinHostPort(host, strconv.Itoa(port))
	if c.f.masterOf[c.addr] != "" || c.f.masterOf[target] != c.addr {
		return fmt.Errorf("ERR FAILOVER target HOST and PORT is not a replica")
	}
	delete(c.f.masterOf, target)
	c.f.masterOf[c.addr] = target
	return nil
}

func (c *conn) ReplicaOf(_ context.Context, host string, port int) error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	if _, err := c.node(); err != nil {
		return err
	}
	if host == "" {
		delete(c.f.masterOf, c.addr)
	} else {
		c.f.masterOf[c.addr] = net.JoinHostPort(host, strconv.Itoa(port))
	}
	return nil
}

func splitAddr(addr string) (string, int) {
	host, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	return host, port
}

func (c *conn) Close() error { return nil }

// ReloadCertificate counts the reloads of the node (Reloads).
func (c *conn) ReloadCertificate(context.Context, []string) error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	n, err := c.node()
	if err != nil {
		return err
	}
	n.Reloads++
	return nil
}

// Reloads is how many times the node at addr was told to read its certificate files again.
func (f *Fake) Reloads(addr string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.nodes[addr]; n != nil {
		return n.Reloads
	}
	return 0
}
