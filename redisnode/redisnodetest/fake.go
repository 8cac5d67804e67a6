// Package redisnodetest fakes Redis nodes for unit tests of code that uses redisnode: each node is
// a map of users, with Redis's rules for what SETUSER, DELUSER and a login do. It checks no rule
// but those the test says Redis refuses. Integration tests use real Redis pods instead.
package redisnodetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"sync"

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
	// Commands counts every command sent to any node.
	Commands int
}

// Node is one fake node's users.
type Node struct {
	Users map[string]redisnode.User
}

// New returns a Fake with no nodes.
func New() *Fake {
	return &Fake{nodes: map[string]*Node{}, Refused: map[string]string{}, Unreachable: map[string]bool{}}
}

// Dial is a redisnode.Dialer of the fake's nodes.
func (f *Fake) Dial(addr, username, password string) redisnode.Node {
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
		return nil, fmt.Errorf("WRONGPASS invalid username-password pair or user is disabled")
	}
	return n, nil
}

func (c *conn) Users(context.Context) ([]string, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	n, err := c.node()
	if err != nil {
		return nil, err
	}
	out := []string{"default"}
	for name := range n.Users {
		out = append(out, name)
	}
	return out, nil
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
	n.Users[u.Name] = u
	return nil
}

func (c *conn) DelUsers(_ context.Context, names ...string) error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	n, err := c.node()
	if err != nil {
		return err
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
	return n.accepts(username, password), nil
}

func (c *conn) Replication(context.Context) (redisnode.Replication, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	if _, err := c.node(); err != nil {
		return redisnode.Replication{}, err
	}
	return redisnode.Replication{Role: "master"}, nil
}

func (c *conn) Close() error { return nil }
