package rediscluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/redisnode"
)

// node is one Redis node as one sync finds it.
type node struct {
	pod, addr string
	// fresh says the node runs a Redis keyroll has not confirmed yet (a new or restarted one).
	fresh bool
	// repair says the node was confirmed on the users it must have, and its ACL changed since.
	repair bool
}

// found is what a sync found changed outside keyroll on one node.
type found struct {
	pod, via string
	// unknown are the users deleted that a confirmed node should not have had (not on a fresh
	// run of Redis, whose extra users come from an older aclfile); restored are the cluster's
	// users that had been changed on the node and were set back.
	unknown, restored []string
}

// syncNode makes the node's ACL exactly want: every wanted user set, the default user off, every
// other user deleted (and confirmed gone), then the current credential confirmed by logging in as
// it. It returns the digest of the node's ACL as it left it, and what it found changed outside
// keyroll.
func (s *usersSyncer) syncNode(ctx context.Context, nd node, want usersWant) (string, found, error) {
	n, via, before, err := s.login(ctx, nd.addr, want)
	if err != nil {
		return "", found{}, err
	}
	defer func() { _ = n.Close() }()
	for _, u := range want.Users.All {
		if err := n.SetUser(ctx, redisnode.User{Name: u.Username, PasswordHash: u.PasswordHash, Rules: u.Rules}); err != nil {
			return "", found{}, err
		}
	}
	if line := userLine(before, "default"); strings.HasPrefix(line, "user default on") {
		if err := n.DisableUser(ctx, "default"); err != nil {
			return "", found{}, err
		}
	}
	var del, unknown []string
	for _, line := range before {
		name := lineUser(line)
		if name == "default" || want.Users.Has(name) {
			continue
		}
		del = append(del, name)
		if !nd.fresh && !slices.Contains(want.Users.Retiring, name) {
			unknown = append(unknown, name)
		}
	}
	if err := n.DelUsers(ctx, del...); err != nil {
		return "", found{}, err
	}
	after, err := n.ACLList(ctx)
	if err != nil {
		return "", found{}, err
	}
	if left := slices.DeleteFunc(slices.Clone(del), func(name string) bool { return userLine(after, name) == "" }); len(left) > 0 {
		return "", found{}, fmt.Errorf("the node still has users %s after deleting them", strings.Join(left, ", "))
	}
	if c := want.Confirm; c != nil {
		ok, err := n.Accepts(ctx, c.Username, c.Password)
		if err != nil {
			return "", found{}, err
		}
		if !ok {
			return "", found{}, fmt.Errorf("the node does not accept user %s after setting it", c.Username)
		}
	}
	return digest(after), found{pod: nd.pod, via: via, unknown: unknown, restored: changedUsers(nd, want, before, after)}, nil
}

// changedUsers are the cluster's users whose line of the node's ACL the sync changed, on a node
// that was confirmed on them: they were changed outside keyroll.
func changedUsers(nd node, want usersWant, before, after []string) []string {
	var out []string
	if !nd.repair {
		return nil
	}
	for _, u := range append([]string{"default"}, names(want.Users)...) {
		if userLine(before, u) != userLine(after, u) {
			out = append(out, u)
		}
	}
	return out
}

// report announces what a sync found changed outside keyroll: one event of each kind for all
// nodes (the recorder folds events of one reason about one version of the cluster into one, and
// would drop the later ones' notes), naming each user and node.
func (s *usersSyncer) report(conds status.Setter, all []found) {
	var removed, restored []string
	for _, f := range all {
		for _, name := range f.unknown {
			removed = append(removed, fmt.Sprintf("%s from pod %s", name, f.pod))
			if s.Removed != nil {
				s.Removed.Inc()
			}
		}
		if len(f.restored) > 0 {
			restored = append(restored, fmt.Sprintf("%s on pod %s (logged in as %s)", strings.Join(f.restored, ", "), f.pod, f.via))
		}
	}
	if len(removed) > 0 {
		conds.Event(true, v1beta1.EventUnknownUserRemoved, "ApplyUsers",
			"Removed users that are not the cluster's (keyroll owns the users of its Redis nodes): %s", strings.Join(removed, "; "))
	}
	if len(restored) > 0 {
		conds.Event(true, v1beta1.EventUserRestored, "ApplyUsers",
			"Set users changed outside keyroll back to the cluster's: %s", strings.Join(restored, "; "))
	}
}

// compare says what differs between the node's ACL and what keyroll confirmed there (digest):
// nothing (""), users that are not the cluster's, application users gone (appGone), the
// cluster's users changed, or keyroll's admin user refused.
func (s *usersSyncer) compare(ctx context.Context, addr string, want usersWant, confirmed string) (what string, appGone bool, err error) {
	n, via, lines, err := s.login(ctx, addr, want)
	if err != nil {
		return "", false, err
	}
	_ = n.Close()
	switch {
	case via != render.AdminUser:
		return render.AdminUser + " refused; keyroll logged in as " + via, false, nil
	case digest(lines) == confirmed:
		return "", false, nil
	}
	var unknown, gone []string
	for _, line := range lines {
		if name := lineUser(line); name != "default" && !want.Users.Has(name) {
			unknown = append(unknown, name)
		}
	}
	for _, name := range want.Users.App {
		if userLine(lines, name) == "" {
			gone = append(gone, name)
		}
	}
	var diffs []string
	if len(unknown) > 0 {
		diffs = append(diffs, "users "+strings.Join(unknown, ", ")+" are not the cluster's")
	}
	if len(gone) > 0 {
		diffs = append(diffs, "users "+strings.Join(gone, ", ")+" are gone (their lease is looked up before they are put back)")
	}
	if len(diffs) == 0 {
		diffs = append(diffs, "the cluster's users were changed")
	}
	return strings.Join(diffs, "; "), len(gone) > 0, nil
}

// login opens a session on the node at addr as keyroll's admin user, or, when the node refuses
// it (its password or rules changed), as the recovery user. It returns the user it logged in as
// and the node's ACL as it found it.
func (s *usersSyncer) login(ctx context.Context, addr string, want usersWant) (redisnode.Node, string, []string, error) {
	adminPassword := want.AdminPassword
	var refused []error
	for _, id := range []struct{ user, password string }{
		{render.AdminUser, adminPassword}, {render.RecoveryUser, render.RecoveryPassword(adminPassword)},
	} {
		n := s.Dial(addr, id.user, id.password, want.tls)
		lines, err := n.ACLList(ctx)
		if err == nil {
			return n, id.user, lines, nil
		}
		_ = n.Close()
		if !redisnode.LoginRefused(err) {
			return nil, "", nil, err
		}
		refused = append(refused, err)
	}
	return nil, "", nil, &lockedOut{errors.Join(refused...)}
}

// lockedOut is a node that refuses both of keyroll's administrative users.
type lockedOut struct{ err error }

func (e *lockedOut) Error() string {
	return fmt.Sprintf("neither %s nor %s may manage the node's users: %v", render.AdminUser, render.RecoveryUser, e.err)
}

func (e *lockedOut) Unwrap() error { return e.err }

// lineUser is the user an ACL LIST line is about.
func lineUser(line string) string {
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "user" {
		return ""
	}
	return f[1]
}

// userLine is the ACL LIST line of user name ("" when the node has no such user).
func userLine(lines []string, name string) string {
	for _, l := range lines {
		if lineUser(l) == name {
			return l
		}
	}
	return ""
}

func names(u render.Users) []string {
	out := make([]string, 0, len(u.All))
	for _, x := range u.All {
		out = append(out, x.Username)
	}
	return out
}

// digest identifies a node's whole ACL (ACL LIST, which Redis lists in one order, users' names,
// flags, password hashes and rules normalised).
func digest(lines []string) string {
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:16])
}

// checks remembers when each cluster's nodes' ACLs were last compared with what was confirmed:
// in memory, so that the comparisons cost no status write (after a restart, every cluster is
// compared at its first sync).
type checks struct {
	mu   sync.Mutex
	last map[types.NamespacedName]time.Time
}

func (c *checks) due(key types.NamespacedName, now time.Time, every time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return every > 0 && now.Sub(c.last[key]) >= every
}

func (c *checks) done(key types.NamespacedName, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[types.NamespacedName]time.Time{}
	}
	c.last[key] = now
}

// next is how long until the cluster's next comparison (0: none).
func (c *checks) next(key types.NamespacedName, now time.Time, every time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if every <= 0 {
		return 0
	}
	return max(every-now.Sub(c.last[key]), time.Millisecond)
}

func (c *checks) forget(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.last, key)
}
