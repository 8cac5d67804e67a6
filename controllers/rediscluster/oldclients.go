package rediscluster

import (
	"cmp"
	"context"
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
)

// Before keyroll retires a superseded credential's user (the user leaves every node, which closes
// its connections, and its lease is revoked), it looks on every node for clients still logged in
// as that user (CLIENT LIST), and finds each one's pod by its address: the consumers' pods were
// restarted onto the new credential, so any other is a client nobody listed. While there are
// such clients the retirement waits as rollout.unlistedClients says, and status, a condition, an
// event and a metric name them.

// oldClientsRecheck is how often a held retirement looks again.
const oldClientsRecheck = 10 * time.Second

// holdForOldUserClients says whether the retirement of the users credential.Retire would take
// off the nodes waits for clients still logged in as them, and when to look again.
func (r *deps) holdForOldUserClients(ctx context.Context, s *credential.Cluster, in *internal) (bool, time.Duration, error) {
	rc := s.RC
	key := client.ObjectKeyFromObject(rc)
	users := credential.UsersToRetire(rc)
	if len(users) == 0 {
		r.clearOldUserClients(s)
		return false, 0, nil
	}
	found, err := r.oldUserClients(ctx, rc, in.Admin, users, false)
	if err != nil {
		return false, 0, err
	}
	if len(found) == 0 {
		r.clearOldUserClients(s)
		return false, 0, nil
	}
	now := r.Clock.Now()
	held := now
	conns := 0
	for i := range found {
		for _, was := range rc.Status.OldUserClients {
			if was.User == found[i].User && was.Address == found[i].Address && was.Since != nil {
				found[i].Since = was.Since
			}
		}
		held = credential.Earliest(held, status.Of(found[i].Since))
		conns += int(found[i].Connections)
	}
	r.Metrics.SetUnlistedClientConnections(key, conns)
	named := describeClients(found)
	ucs := rc.Spec.Rollout.UnlistedClients
	grace := v1beta1.DefaultUnlistedClientsGrace
	if ucs.Grace != nil {
		grace = ucs.Grace.Duration
	}
	restarting := false
	if ucs.Action == v1beta1.UnlistedClientsRestart {
		if added := adoptLoggedIn(rc, found); len(added) > 0 {
			restarting = true
			s.Conds.Event(false, v1beta1.EventUnlistedClientRestarting, "Retire",
				"Restarting %s, one at a time as consumers: logged in with the superseded user %s and not listed (rollout.unlistedClients Restart)",
				strings.Join(added, ", "), strings.Join(users, ", "))
		}
	}
	if ucs.Action == v1beta1.UnlistedClientsProceed && !now.Before(held.Add(grace)) {
		s.Conds.Event(true, v1beta1.EventUnlistedClientsCutOff, "Retire",
			"Retiring %s after the %s grace (rollout.unlistedClients Proceed): cut off %s", strings.Join(users, ", "), grace, named)
		r.clearOldUserClients(s)
		return false, 0, nil
	}
	if len(found) > 16 {
		found = found[:16] // the status holds 16; the message counts them all
	}
	rc.Status.OldUserClients = found
	what := "they log in with the new credential or stop (rollout.unlistedClients Wait)"
	wait := oldClientsRecheck
	if ucs.Action == v1beta1.UnlistedClientsRestart {
		what = "those that are Deployments, StatefulSets or DaemonSets of this namespace are restarted onto the new credential (status.consumers), and the others log in with it or stop (rollout.unlistedClients Restart)"
	}
	if restarting {
		wait = lagWait // the rollout that restarts them starts at the next look
	}
	if ucs.Action == v1beta1.UnlistedClientsProceed {
		what = fmt.Sprintf("they log in with the new credential, or for %s, until %s, when they are cut off (rollout.unlistedClients Proceed)",
			grace, held.Add(grace).UTC().Format(time.RFC3339))
		wait = min(wait, held.Add(grace).Sub(now)+time.Second)
	}
	msg := fmt.Sprintf("Still logged in with the superseded user %s, and not listed consumers: %s; the user and its lease are kept until %s",
		strings.Join(users, ", "), named, what)
	if s.Conds.Set(v1beta1.ConditionLeasesRevoked, metav1.ConditionFalse, v1beta1.ReasonClientsStillLoggedIn, msg) {
		s.Conds.Announce(true, v1beta1.EventOldCredentialInUse, "Retire", "%s", msg)
	}
	return true, wait, nil
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
	for _, p := range m.Pods {
		if p.Status.PodIP == "" || !p.DeletionTimestamp.IsZero() {
			continue
		}
		n := r.nodes.Dial(net.JoinHostPort(p.Status.PodIP, fmt.Sprint(render.RedisPort)), render.AdminUser, admin, r.tls.For(rc))
		conns, err := n.Clients(ctx)
		_ = n.Close()
		if err != nil {
			return nil, fmt.Errorf("listing the clients of %s: %w", p.Name, err)
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
	for k, n := range count {
		workload, listed, err := r.clientAt(ctx, rc, k[1])
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
	return out, nil
}

// clientAt names what the client at ip is (a pod's workload, "" for an address that is no pod's)
// and says whether it is a listed consumer of rc. The pod is looked up past the cache, which holds
// keyroll's own pods only.
func (r *deps) clientAt(ctx context.Context, rc *v1beta1.RedisCluster, ip string) (string, bool, error) {
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.MatchingFields{"status.podIP": ip}); err != nil {
		return "", false, fmt.Errorf("finding the pod at %s: %w", ip, err)
	}
	for _, p := range pods.Items {
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		kind, name := workloadOf(&p)
		listed := p.Namespace == rc.Namespace && slices.Contains(consumerRefs(rc), v1beta1.ConsumerReference{Kind: kind, Name: name})
		w := kind + "/" + name
		if p.Namespace != rc.Namespace {
			w += " in namespace " + p.Namespace
		}
		return w, listed, nil
	}
	return "", false, nil
}

// workloadOf is the workload a pod belongs to: its controller (a ReplicaSet's Deployment, named
// by the ReplicaSet's name less the pod-template hash), or the pod itself.
func workloadOf(p *corev1.Pod) (kind, name string) {
	ref := metav1.GetControllerOf(p)
	if ref == nil {
		return "Pod", p.Name
	}
	if h := p.Labels["pod-template-hash"]; ref.Kind == "ReplicaSet" && h != "" && strings.HasSuffix(ref.Name, "-"+h) {
		return "Deployment", strings.TrimSuffix(ref.Name, "-"+h)
	}
	return ref.Kind, ref.Name
}

// describeClients names the clients for a message: each workload or address, its user and its
// connections.
func describeClients(cs []v1beta1.OldUserClient) string {
	var parts []string
	for _, c := range cs {
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
