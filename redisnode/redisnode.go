// Package redisnode is keyroll's client of one Redis node: its ACL users changed one at a time
// (ACL SETUSER and ACL DELUSER, never ACL LOAD, which on Redis 7.0 disconnects every client), a
// user's password confirmed by authenticating as that user, and the node's replication state.
// Plain values in and out; it knows nothing of Kubernetes.
package redisnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Timeout bounds every exchange with a node: dialling, and each command.
const Timeout = 5 * time.Second

// User is one ACL user as keyroll sets it on a node.
type User struct {
	Name string
	// PasswordHash is the SHA-256 of the user's one password, lower-case hex: the password
	// itself never needs to reach the node from keyroll.
	PasswordHash string
	// Rules are the user's key, channel and command rules (aclRules).
	Rules []string
}

// Node is what keyroll does on one Redis node. Client implements it; redisnodetest fakes it.
type Node interface {
	// ACLList is the node's whole ACL, one line per user (ACL LIST): names, flags, password
	// hashes and rules, as Redis normalises them.
	ACLList(ctx context.Context) ([]string, error)
	// DisableUser resets the user to off, with no password and no rights (the default user of
	// keyroll's aclfile).
	DisableUser(ctx context.Context, name string) error
	// SetUser makes the user exactly u: enabled, with u's one password and rules, whatever it
	// was before. Connections already authenticated as the user stay open.
	SetUser(ctx context.Context, u User) error
	// DelUsers removes the users; Redis closes the connections authenticated as them. A user
	// the node does not have is no error.
	DelUsers(ctx context.Context, names ...string) error
	// CheckRules asks the node whether it accepts rules, without changing any user that can log
	// in: a *RuleError says which rule it refused and why.
	CheckRules(ctx context.Context, rules []string) error
	// Accepts says whether the node lets username log in with password, on a connection of its
	// own. A user whose rules forbid PING is accepted all the same.
	Accepts(ctx context.Context, username, password string) (bool, error)
	// Replication is the node's replication state.
	Replication(ctx context.Context) (Replication, error)
	// Failover hands the node's primary role to its replica at host:port with Redis's
	// coordinated FAILOVER: writes pause until the replica has caught up, then the replica is the
	// primary and this node its replica. It returns once Redis has started it; if the replica has
	// not caught up within timeout, Redis aborts it and this node stays the primary.
	Failover(ctx context.Context, host string, port int, timeout time.Duration) error
	// ReplicaOf makes the node a replica of host:port, or a primary when host is empty.
	ReplicaOf(ctx context.Context, host string, port int) error
	// Clients are the node's client connections (CLIENT LIST): who each is logged in as, and
	// where it comes from.
	Clients(ctx context.Context) ([]Conn, error)
	// ReloadCertificate sets the node's TLS file settings (CONFIG SET, pairs of name and path):
	// Redis reads the files again, for new connections; open ones stay as they are.
	ReloadCertificate(ctx context.Context, settings []string) error
	// Close ends the connection.
	Close() error
}

// Dialer opens a Node at addr (host:port) as the given user, over TLS when tlsConf is set (which
// then says what the node's certificate is checked against). Connections are made when first
// needed.
type Dialer func(addr, username, password string, tlsConf *tls.Config) Node

// Dial is the Dialer of real nodes.
func Dial(addr, username, password string, tlsConf *tls.Config) Node {
	return New(addr, username, password, tlsConf)
}

func init() { redis.SetLogger(quiet{}) }

// quiet drops go-redis's own log lines (a failed dial, for one): every failure is returned to
// the caller, which reports it.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Client is a connection to one Redis node.
type Client struct {
	addr string
	tls  *tls.Config
	c    *redis.Client
}

var _ Node = (*Client)(nil)

// New returns a client of the node at addr that authenticates as username, over TLS when
// tlsConf is set.
func New(addr, username, password string, tlsConf *tls.Config) *Client {
	return &Client{addr: addr, tls: tlsConf, c: newClient(options(addr, username, password, tlsConf))}
}

// options are go-redis's settings for keyroll's short exchanges: one connection, no retries (the
// reconciler retries), RESP2 with a plain AUTH (Redis 7.0 has no CLIENT SETINFO), and no
// maintenance notifications; TLS when tlsConf is set.
func options(addr, username, password string, tlsConf *tls.Config) *redis.Options {
	if tlsConf != nil {
		tlsConf = tlsConf.Clone()
	}
	return &redis.Options{
		TLSConfig: tlsConf,
		Addr:      addr, Username: username, Password: password,
		Protocol: 2, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		DialTimeout:              Timeout, ReadTimeout: Timeout, WriteTimeout: Timeout, ContextTimeoutEnabled: true,
		PoolSize: 1, MaxRetries: -1, DialerRetries: 1,
	}
}

// Close ends the connection.
func (n *Client) Close() error { return n.c.Close() }

// Users lists the node's ACL users.
func (n *Client) Users(ctx context.Context) ([]string, error) {
	users, err := n.c.ACLUsers(ctx).Result()
	if err != nil {
		return nil, n.wrap("listing ACL users", err)
	}
	return users, nil
}

// ACLList reads ACL LIST.
func (n *Client) ACLList(ctx context.Context) ([]string, error) {
	lines, err := n.c.ACLList(ctx).Result()
	if err != nil {
		return nil, n.wrap("reading ACL LIST", err)
	}
	return lines, nil
}

// DisableUser sends ACL SETUSER name reset.
func (n *Client) DisableUser(ctx context.Context, name string) error {
	if err := n.c.ACLSetUser(ctx, name, "reset").Err(); err != nil {
		return n.wrap("disabling user "+name, err)
	}
	return nil
}

// hashPattern is a SHA-256 in lower-case hex, as Redis's #<hash> rule takes it.
var hashPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// SetUser makes u exactly as given: reset first (no password, no keys, no commands, off), then
// on with its one password and its rules, in one command, which Redis applies whole or not at all.
func (n *Client) SetUser(ctx context.Context, u User) error {
	if !hashPattern.MatchString(u.PasswordHash) {
		return fmt.Errorf("user %s: the password hash is not a SHA-256 in hex", u.Name)
	}
	args := append([]string{"reset", "on", "#" + u.PasswordHash}, u.Rules...)
	if err := n.c.ACLSetUser(ctx, u.Name, args...).Err(); err != nil {
		if re := ruleError(err); re != nil {
			return fmt.Errorf("setting user %s on %s: %w", u.Name, n.addr, re)
		}
		return n.wrap("setting user "+u.Name, err)
	}
	return nil
}

// DelUsers removes users.
func (n *Client) DelUsers(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	args := make([]any, 0, len(names)+2)
	args = append(args, "ACL", "DELUSER")
	for _, name := range names {
		args = append(args, name)
	}
	if err := n.c.Do(ctx, args...).Err(); err != nil {
		return n.wrap("deleting users "+strings.Join(names, ", "), err)
	}
	return nil
}

// ruleCheckUser is the scratch user CheckRules sets: off and without a password, so that no one
// can log in as it, and deleted again at once.
const ruleCheckUser = "keyroll-rule-check"

// CheckRules sets the scratch user with rules and deletes it again.
func (n *Client) CheckRules(ctx context.Context, rules []string) error {
	args := append([]string{"reset"}, rules...)
	err := n.c.ACLSetUser(ctx, ruleCheckUser, args...).Err()
	if re := ruleError(err); re != nil {
		return re
	}
	if err != nil {
		return n.wrap("checking ACL rules", err)
	}
	return n.DelUsers(ctx, ruleCheckUser)
}

// Accepts authenticates as username with password on a connection of its own.
func (n *Client) Accepts(ctx context.Context, username, password string) (bool, error) {
	c := newClient(options(n.addr, username, password, n.tls))
	defer func() { _ = c.Close() }()
	err := c.Ping(ctx).Err()
	switch {
	case err == nil, isReply(err, "NOPERM"):
		return true, nil // authenticated; PING may not be among the user's commands
	case isReply(err, "WRONGPASS"):
		return false, nil
	}
	return false, n.wrap("authenticating as "+username, err)
}

// Replication is a node's replication state, from INFO.
type Replication struct {
	// Role is master or slave, as Redis says it.
	Role string
	// LinkUp says a replica's link to its primary is up (master_link_status:up).
	LinkUp bool
	// SyncInProgress says a replica is still loading its primary's data.
	SyncInProgress bool
	// ConnectedReplicas is how many replicas a primary has.
	ConnectedReplicas int
	// FullSyncs and PartialSyncs count the resyncs this node served as a primary since it
	// started (sync_full, sync_partial_ok).
	FullSyncs, PartialSyncs int
	// MasterHost and MasterPort are a replica's primary, as it was told.
	MasterHost string
	MasterPort int
	// Offset is the node's replication offset (master_repl_offset): on a primary, how far its
	// stream has gone; on a replica, how far it has taken it in.
	Offset int64
	// Replicas are a primary's connected replicas.
	Replicas []Replica
}

// Replica is one replica as its primary sees it.
type Replica struct {
	IP     string
	Port   int
	State  string // online once its initial sync is done
	Offset int64
}

// Replication reads INFO replication and INFO stats.
func (n *Client) Replication(ctx context.Context) (Replication, error) {
	repl, err := n.c.Info(ctx, "replication").Result()
	if err != nil {
		return Replication{}, n.wrap("reading INFO replication", err)
	}
	stats, err := n.c.Info(ctx, "stats").Result()
	if err != nil {
		return Replication{}, n.wrap("reading INFO stats", err)
	}
	return ParseReplication(repl + "\n" + stats), nil
}

// ParseReplication reads the fields of Replication from INFO's text.
func ParseReplication(info string) Replication {
	f := InfoFields(info)
	num := func(k string) int {
		var v int
		_, _ = fmt.Sscan(f[k], &v)
		return v
	}
	r := Replication{
		Role: f["role"], LinkUp: f["master_link_status"] == "up", SyncInProgress: f["master_sync_in_progress"] == "1",
		ConnectedReplicas: num("connected_slaves"), FullSyncs: num("sync_full"), PartialSyncs: num("sync_partial_ok"),
		MasterHost: f["master_host"], MasterPort: num("master_port"), Offset: int64(num("master_repl_offset")),
	}
	for i := 0; ; i++ {
		v, ok := f[fmt.Sprintf("slave%d", i)]
		if !ok {
			break
		}
		// slave0:ip=10.0.0.11,port=6379,state=online,offset=1234,lag=0
		var rep Replica
		for _, kv := range strings.Split(v, ",") {
			k, val, _ := strings.Cut(kv, "=")
			switch k {
			case "ip":
				rep.IP = val
			case "port":
				_, _ = fmt.Sscan(val, &rep.Port)
			case "state":
				rep.State = val
			case "offset":
				_, _ = fmt.Sscan(val, &rep.Offset)
			}
		}
		r.Replicas = append(r.Replicas, rep)
	}
	return r
}

// Failover starts a coordinated FAILOVER to the replica at host:port.
func (n *Client) Failover(ctx context.Context, host string, port int, timeout time.Duration) error {
	err := n.c.Do(ctx, "FAILOVER", "TO", host, strconv.Itoa(port), "TIMEOUT", strconv.FormatInt(timeout.Milliseconds(), 10)).Err()
	if err != nil {
		return n.wrap("starting FAILOVER to "+net.JoinHostPort(host, strconv.Itoa(port)), err)
	}
	return nil
}

// ReplicaOf sends REPLICAOF host port, or REPLICAOF NO ONE when host is empty.
func (n *Client) ReplicaOf(ctx context.Context, host string, port int) error {
	args := []any{"REPLICAOF", "NO", "ONE"}
	what := "making the node a primary"
	if host != "" {
		args = []any{"REPLICAOF", host, strconv.Itoa(port)}
		what = "making the node a replica of " + net.JoinHostPort(host, strconv.Itoa(port))
	}
	if err := n.c.Do(ctx, args...).Err(); err != nil {
		return n.wrap(what, err)
	}
	return nil
}

// InfoFields splits INFO's text into its key:value fields.
func InfoFields(info string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") {
			out[k] = v
		}
	}
	return out
}

// RuleError is an ACL rule a node refused, with Redis's own words.
type RuleError struct {
	Rule    string
	Message string
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("Redis refused ACL rule %q: %s", e.Rule, e.Message)
}

// ruleErrorPattern is how Redis 7 words a refused rule of ACL SETUSER.
var ruleErrorPattern = regexp.MustCompile(`^ERR Error in ACL SETUSER modifier '(.*)': (.*)$`)

func ruleError(err error) *RuleError {
	if err == nil {
		return nil
	}
	if m := ruleErrorPattern.FindStringSubmatch(err.Error()); m != nil {
		return &RuleError{Rule: m[1], Message: m[2]}
	}
	return nil
}

// isReply says whether err is a Redis error reply with the given code (WRONGPASS, NOPERM).
func isReply(err error, code string) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), code+" ")
}

// wrap names the node and what was done. Whether the node could not be reached shows in
// Unreachable.
func (n *Client) wrap(what string, err error) error {
	return fmt.Errorf("%s on %s: %w", what, n.addr, err)
}

// LoginRefused says whether err is a node's refusal of the connection's user: its password no
// longer matches, the user is gone or off (WRONGPASS), or it may no longer run what keyroll asked
// (NOPERM).
func LoginRefused(err error) bool {
	return isReply(err, "WRONGPASS") || isReply(err, "NOPERM")
}

// Unreachable says whether err means that no connection to the node could be made or kept (as
// opposed to a reply of the node).
func Unreachable(err error) bool {
	var ne net.Error
	var re redis.Error
	return errors.As(err, &ne) || (!errors.As(err, &re) && errors.Is(err, context.DeadlineExceeded))
}

// ReloadCertificate sets the node's TLS file settings (CONFIG SET name path ...).
func (n *Client) ReloadCertificate(ctx context.Context, settings []string) error {
	args := []any{"CONFIG", "SET"}
	for _, s := range settings {
		args = append(args, s)
	}
	if err := n.c.Do(ctx, args...).Err(); err != nil {
		return n.wrap("reloading the TLS certificate", err)
	}
	return nil
}
