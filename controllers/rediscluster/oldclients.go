package rediscluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/redisnode"
)

// Before keyroll retires a superseded credential's user (the user leaves every node, which closes
// its connections, and its lease is revoked), it looks on every node for clients still logged in
// as that user (CLIENT LIST), and finds each one's pod by its address: the consumers' pods were
// restarted onto the new credential, so any other is a client nobody listed. While there are
// such clients the retirement waits as rollout.unlistedClients says, and status, a condition, an
// event and a metric name them.

// maxOldUserClients is how many clients status.oldUserClients holds (the schema's bound).
const maxOldUserClients = 16

// oldClientsRecheck is how often a held retirement looks again.
const oldClientsRecheck = 10 * time.Second

// holdForOldUserClients says which of the users credential.Retire would take off the nodes wait
// for clients still logged in as them, and when to look again. Each user is held on its own, for
// at most the bound rollout.unlistedClients sets (Proceed's grace, or maxHold) from when keyroll
// first saw its clients; then it retires, cutting them off, and an event says whom. A user whose
// lease is gone from Vault is never held.
func (r *deps) holdForOldUserClients(ctx context.Context, s *credential.Cluster, in *internal) ([]string, time.Duration, error) {
	rc := s.RC
	users := slices.DeleteFunc(credential.UsersToRetire(rc), func(u string) bool { return slices.Contains(credential.Gone(rc), u) })
	if len(users) == 0 {
		r.clearOldUserClients(s)
		return nil, 0, nil
	}
	found, err := r.oldUserClients(ctx, rc, in.Admin, users, false)
	if err != nil {
		return nil, 0, err
	}
	now := r.Clock.Now()
	since := map[string]time.Time{} // when keyroll first saw each user's clients
	conns := 0
	for i := range found {
		for _, was := range rc.Status.OldUserClients {
			if was.User == found[i].User && was.Address == found[i].Address && was.Since != nil {
				found[i].Since = was.Since
			}
		}
		since[found[i].User] = credential.Earliest(credential.Earliest(since[found[i].User], now), status.Of(found[i].Since))
		conns += int(found[i].Connections)
	}
	r.Metrics.SetUnlistedClientConnections(client.ObjectKeyFromObject(rc), conns)
	ucs := rc.Spec.Rollout.UnlistedClients
	restarting := r.restartLoggedIn(s, found, users)
	bound, until := holdBound(ucs), time.Time{}
	var held, cut []string
	for _, u := range users {
		switch t, ok := since[u]; {
		case !ok:
		case now.Before(t.Add(bound)):
			held, until = append(held, u), credential.Earliest(until, t.Add(bound))
		default:
			cut = append(cut, u)
		}
	}
	if len(cut) > 0 {
		s.Conds.Event(true, v1beta1.EventUnlistedClientsCutOff, "Retire", "Retiring %s after %s (%s): cut off %s",
			strings.Join(cut, ", "), bound, holdField(ucs), describeClients(clientsOf(found, cut)))
	}
	if len(held) == 0 {
		r.clearOldUserClients(s)
		return nil, 0, nil
	}
	r.reportHeld(s, clientsOf(found, held), held, until)
	wait := min(oldClientsRecheck, until.Sub(now)+time.Second)
	if restarting {
		wait = lagWait // the rollout that restarts them starts at the next look
	}
	return held, wait, nil
}

// holdBound is how long a user is held for unlisted clients: Proceed's grace, or maxHold.
func holdBound(ucs v1beta1.UnlistedClientsSpec) time.Duration {
	if ucs.Action == v1beta1.UnlistedClientsProceed {
		if ucs.Grace != nil {
			return ucs.Grace.Duration
		}
		return v1beta1.DefaultUnlistedClientsGrace
	}
	if ucs.MaxHold != nil {
		return ucs.MaxHold.Duration
	}
	return v1beta1.DefaultUnlistedClientsMaxHold
}

// holdField names the setting that bounds the hold, for messages.
func holdField(ucs v1beta1.UnlistedClientsSpec) string {
	if ucs.Action == v1beta1.UnlistedClientsProceed {
		return "rollout.unlistedClients Proceed, its grace"
	}
	return "rollout.unlistedClients.maxHold"
}

// clientsOf are the clients logged in as one of users.
func clientsOf(found []v1beta1.OldUserClient, users []string) []v1beta1.OldUserClient {
	return slices.DeleteFunc(slices.Clone(found), func(c v1beta1.OldUserClient) bool { return !slices.Contains(users, c.User) })
}

// restartLoggedIn, with rollout.unlistedClients Restart, makes the clients' workloads consumers
// to restart; it says whether it added one (the rollout that restarts them starts at the next look).
func (r *deps) restartLoggedIn(s *credential.Cluster, found []v1beta1.OldUserClient, users []string) bool {
	if s.RC.Spec.Rollout.UnlistedClients.Action != v1beta1.UnlistedClientsRestart {
		return false
	}
	added := adoptLoggedIn(s.RC, found)
	if len(added) > 0 {
		s.Conds.Event(false, v1beta1.EventUnlistedClientRestarting, "Retire",
			"Restarting %s, one at a time as consumers: logged in with the superseded user %s and not listed (rollout.unlistedClients Restart)",
			strings.Join(added, ", "), strings.Join(users, ", "))
	}
	return len(added) > 0
}

// reportHeld says, in status, the condition and an event, which users wait for which clients,
// and until when at most.
func (r *deps) reportHeld(s *credential.Cluster, found []v1beta1.OldUserClient, held []string, until time.Time) {
	rc := s.RC
	ucs := rc.Spec.Rollout.UnlistedClients
	rc.Status.OldUserClients = found[:min(len(found), maxOldUserClients)] // the message counts them all
	end := until.UTC().Format(time.RFC3339)
	what := fmt.Sprintf("they log in with the new credential or stop, or until %s (rollout.unlistedClients.maxHold), when they are cut off (rollout.unlistedClients Wait)", end)
	switch ucs.Action {
	case v1beta1.UnlistedClientsRestart:
		what = fmt.Sprintf("those that are Deployments, StatefulSets or DaemonSets of this namespace are restarted onto the new credential (status.consumers), and the others log in with it or stop, or until %s (rollout.unlistedClients.maxHold), when they are cut off (rollout.unlistedClients Restart)", end)
	case v1beta1.UnlistedClientsProceed:
		what = fmt.Sprintf("they log in with the new credential, or until %s, when they are cut off (rollout.unlistedClients Proceed)", end)
	}
	msg := fmt.Sprintf("Still logged in with the superseded user %s, and not listed consumers: %s; the user and its lease are kept until %s",
		strings.Join(held, ", "), describeClients(found), what)
	if s.Conds.Set(v1beta1.ConditionLeasesRevoked, metav1.ConditionFalse, v1beta1.ReasonClientsStillLoggedIn, msg) {
		s.Conds.Announce(true, v1beta1.EventOldCredentialInUse, "Retire", "%s", msg)
	}
}

// nameCutOff says, in a Warning event, who is logged in as a user that is cut off at once (its
// lease revoked outside keyroll, onRevokedOutside CutOff) just before it leaves the nodes: listed
// consumers and others alike lose their connections.
func (r *deps) nameCutOff(ctx context.Context, s *credential.Cluster, in *internal) {
	users := credential.CutOffUsers(s.RC)
	if len(users) == 0 {
		return
	}
	found, err := r.oldUserClients(ctx, s.RC, in.Admin, users, true)
	if err != nil || len(found) == 0 {
		return // the users step reports a node it cannot reach
	}
	s.Conds.Event(true, v1beta1.EventClientsCutOff, "Retire", "Cutting off %s (lease revoked outside keyroll, onRevokedOutside CutOff): %s",
		strings.Join(users, ", "), describeClients(found))
}

// clearOldUserClients forgets the clients of a retirement that no longer waits for them.
func (r *deps) clearOldUserClients(s *credential.Cluster) {
	rc := s.RC
	rc.Status.OldUserClients = nil
	r.Metrics.SetUnlistedClientConnections(client.ObjectKeyFromObject(rc), 0)
	if c := meta.FindStatusCondition(rc.Status.Conditions, v1beta1.ConditionLeasesRevoked); c != nil && c.Reason == v1beta1.ReasonClientsStillLoggedIn {
		s.Conds.Set(v1beta1.ConditionLeasesRevoked, metav1.ConditionTrue, v1beta1.ReasonAvailable, "No client that is not a listed consumer is logged in with a superseded user")
	}
}

// oldUserClients lists, over every Redis node, the clients logged in as one of users that are
// not the pods of listed consumers (all of them, with listedToo), one entry per user and address.
func (r *deps) oldUserClients(ctx context.Context, rc *v1beta1.RedisCluster, admin string, users []string, listedToo bool) ([]v1beta1.OldUserClient, error) {
	m, err := listMembers(ctx, r.Client, rc)
	if err != nil {
		return nil, err
	}
	count := map[[2]string]int32{} // user, ip
	var unknown []v1beta1.OldUserClient
	for _, p := range m.Pods {
		if p.Status.PodIP == "" || !p.DeletionTimestamp.IsZero() {
			continue
		}
		n := r.nodes.Dial(net.JoinHostPort(p.Status.PodIP, fmt.Sprint(render.RedisPort)), render.AdminUser, admin, r.tls.For(rc))
		conns, err := n.Clients(ctx)
		_ = n.Close()
		if err != nil {
			unknown = append(unknown, unknownClients(p, users, err, r.Clock.Now())...)
			continue
		}
		for _, c := range conns {
			if !slices.Contains(users, c.User) {
				continue
			}
			ip := c.Addr
			if ap, err := netip.ParseAddrPort(c.Addr); err == nil {
				ip = ap.Addr().String()
			}
			count[[2]string{c.User, ip}]++
		}
	}
	var out []v1beta1.OldUserClient
	owners := &podOwners{Reader: r.APIReader}
	for k, n := range count {
		workload, listed, err := r.clientAt(ctx, rc, owners, k[1])
		if err != nil {
			return nil, err
		}
		if !listed || listedToo {
			out = append(out, v1beta1.OldUserClient{User: k[0], Address: k[1], Workload: workload, Connections: n,
				Since: status.At(r.Clock.Now())})
		}
	}
	slices.SortFunc(out, func(a, b v1beta1.OldUserClient) int {
		return cmp.Or(strings.Compare(a.Workload, b.Workload), strings.Compare(a.Address, b.Address), strings.Compare(a.User, b.User))
	})
	return append(unknown, out...), nil
}

// unknownClients stands for the clients of a node whose CLIENT LIST could not be read (a reply
// over redisnode's bound, as when clients give their connections huge names; no answer in time;
// no connection): for each user, someone may be logged in there. Wait holds the retirement for
// them as for any unlisted client, Proceed runs its grace; they are never a workload to restart.
func unknownClients(p *corev1.Pod, users []string, err error, now time.Time) []v1beta1.OldUserClient {
	why := "no answer"
	if errors.Is(err, redisnode.ErrReplyTooLarge) {
		why = "its CLIENT LIST is over keyroll's bound of 8 MiB"
	}
	out := make([]v1beta1.OldUserClient, 0, len(users))
	for _, u := range users {
		out = append(out, v1beta1.OldUserClient{User: u, Address: p.Status.PodIP,
			Workload: fmt.Sprintf("unknown: the clients of Redis pod %s could not be read (%s)", p.Name, why),
			Since:    status.At(now)})
	}
	return out
}

// clientAt names what the client at ip is (a pod's workload, "" for an address that is no pod's)
// and says whether it is a listed consumer of rc. The pod is looked up past the cache, which holds
// keyroll's own pods only.
func (r *deps) clientAt(ctx context.Context, rc *v1beta1.RedisCluster, owners *podOwners, ip string) (string, bool, error) {
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.MatchingFields{"status.podIP": ip}); err != nil {
		return "", false, fmt.Errorf("finding the pod at %s: %w", ip, err)
	}
	for _, p := range pods.Items {
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if p.Namespace != rc.Namespace {
			return otherNamespace, false, nil // whose it is is not this namespace's to know
		}
		kind, name, err := owners.workloadOf(ctx, &p)
		if err != nil {
			return "", false, err
		}
		return kind + "/" + name, slices.Contains(consumerRefs(rc), v1beta1.ConsumerReference{Kind: kind, Name: name}), nil
	}
	return "", false, nil
}

// otherNamespace is the workload of a client whose pod is in another namespace.
const otherNamespace = "a client of another namespace"

// maxNamedClients is how many clients a message or an event names; it counts the others. A
// condition's message holds 32 KiB, and a cluster may have thousands of clients.
const maxNamedClients = 10

// describeClients names the clients for a message: each workload or address, its user and its
// connections, the first maxNamedClients of them, then how many more.
func describeClients(cs []v1beta1.OldUserClient) string {
	var parts []string
	for i, c := range cs {
		if i == maxNamedClients {
			parts = append(parts, fmt.Sprintf("and %d more (status.oldUserClients lists %d)", len(cs)-i, min(len(cs), maxOldUserClients)))
			break
		}
		who := c.Workload
		if who == "" {
			who = "address " + c.Address + " (no pod's)"
		} else {
			who += " (" + c.Address + ")"
		}
		parts = append(parts, fmt.Sprintf("%s as %s, %d connection(s)", who, c.User, c.Connections))
	}
	return strings.Join(parts, "; ")
}
