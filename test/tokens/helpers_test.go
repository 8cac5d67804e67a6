package tokens

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/testground"
)

// eventually polls check until it returns "" or the timeout passes; the last message explains a failure.
func eventually(t *testing.T, timeout time.Duration, check func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	msg := ""
	for time.Now().Before(deadline) {
		if msg = check(); msg == "" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("after %s: %s", timeout, msg)
}

func namespace(t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
}

// vaultConnection creates a VaultConnection with Kubernetes auth as the given role, for one namespace.
func vaultConnection(t *testing.T, name, role, ns string) *v1alpha1.VaultConnection {
	t.Helper()
	vc := &v1alpha1.VaultConnection{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VaultConnectionSpec{
			Address:           ground.Vault.Addr,
			Auth:              v1alpha1.VaultAuth{Kubernetes: &v1alpha1.KubernetesAuth{Role: role}},
			AllowedNamespaces: []string{ns},
		},
	}
	if err := k8s.Create(context.Background(), vc); err != nil {
		t.Fatal(err)
	}
	return vc
}

func getConnection(t *testing.T, name string) *v1alpha1.VaultConnection {
	t.Helper()
	vc := &v1alpha1.VaultConnection{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, vc); err != nil {
		t.Fatal(err)
	}
	return vc
}

// redisCluster creates a RedisCluster that takes its credential from leasePath.
func redisCluster(t *testing.T, ns, name, connection string, mutate ...func(*v1alpha1.RedisCluster)) *v1alpha1.RedisCluster {
	t.Helper()
	rc := &v1alpha1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RedisClusterSpec{
			Replicas: 1, Version: "7.0", // the real node's Redis image
			Credentials: v1alpha1.CredentialsSpec{
				Source: v1alpha1.SourceVaultLease,
				VaultLease: &v1alpha1.VaultLeaseSource{
					ConnectionRef: v1alpha1.ConnectionReference{Name: connection}, Path: leasePath,
				},
			},
		},
	}
	for _, m := range mutate {
		m(rc)
	}
	if err := k8s.Create(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

func get(t *testing.T, rc *v1alpha1.RedisCluster) *v1alpha1.RedisCluster {
	t.Helper()
	out := &v1alpha1.RedisCluster{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitCondition waits until the RedisCluster has a condition with the given status (and reason).
func waitCondition(t *testing.T, rc *v1alpha1.RedisCluster, condType string, status metav1.ConditionStatus, reason string, timeout time.Duration) *v1alpha1.RedisCluster {
	t.Helper()
	var cur *v1alpha1.RedisCluster
	eventually(t, timeout, func() string {
		cur = get(t, rc)
		c := meta.FindStatusCondition(cur.Status.Conditions, condType)
		if c == nil || c.Status != status || (reason != "" && c.Reason != reason) {
			return fmt.Sprintf("%s: condition %s is %+v, want %s/%s", rc.Name, condType, c, status, reason)
		}
		return ""
	})
	return cur
}

// credentials reads the credentials Secret.
func credentials(t *testing.T, rc *v1alpha1.RedisCluster) (user, pass string, ok bool) {
	t.Helper()
	sec := &corev1.Secret{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name + "-credentials"}, sec); err != nil {
		return "", "", false
	}
	return string(sec.Data["username"]), string(sec.Data["password"]), true
}

// authenticates says whether a credential works against the Redis that Vault manages users on.
func authenticates(user, pass string) bool {
	who, err := ground.Redis.WhoAmI(user, pass)
	return err == nil && who == user
}

// eventReasons lists the reasons of the events about an object.
func eventReasons(t *testing.T, ns, name string) []string {
	t.Helper()
	var out []string
	for _, e := range eventsAbout(t, ns, name) {
		out = append(out, e.Reason)
	}
	return out
}

// eventsAbout lists the events in ns about the object name.
func eventsAbout(t *testing.T, ns, name string) []eventsv1.Event {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// nodeLogins logs in as user on every Redis pod of rc (pods 0 to spec.replicas-1, by pod IP: the
// host reaches the node's pods directly) and sorts the pods by the outcome: accepted (ACL WHOAMI
// names user), refused (Redis refused the login: WRONGPASS) and failed (anything else: no pod, no
// IP, no answer), each with the pod's name and, for failed, why.
func nodeLogins(t *testing.T, rc *v1alpha1.RedisCluster, user, pass string) (accepted, refused, failed []string) {
	t.Helper()
	cur := get(t, rc)
	for i := range cur.Spec.Replicas {
		name := fmt.Sprintf("%s-%d", rc.Name, i)
		pod, err := cs.CoreV1().Pods(rc.Namespace).Get(context.Background(), name, metav1.GetOptions{})
		switch {
		case err != nil:
			failed = append(failed, fmt.Sprintf("%s (%v)", name, err))
			continue
		case pod.Status.PodIP == "":
			failed = append(failed, name+" (no pod IP)")
			continue
		}
		addr := net.JoinHostPort(pod.Status.PodIP, "6379")
		who, err := testground.RedisWhoAmI(addr, user, pass)
		switch {
		case err == nil && who == user:
			accepted = append(accepted, name)
		case err != nil && strings.Contains(err.Error(), "WRONGPASS"):
			refused = append(refused, name)
		case err != nil:
			failed = append(failed, fmt.Sprintf("%s at %s (%v)", name, addr, err))
		default:
			failed = append(failed, fmt.Sprintf("%s at %s (logged in as %q)", name, addr, who))
		}
	}
	return accepted, refused, failed
}

// onEveryNode says why user is not accepted on every Redis pod of rc ("" when it is).
func onEveryNode(t *testing.T, rc *v1alpha1.RedisCluster, user, pass string) string {
	t.Helper()
	accepted, refused, failed := nodeLogins(t, rc, user, pass)
	if len(refused)+len(failed) == 0 && len(accepted) > 0 {
		return ""
	}
	return fmt.Sprintf("user %s: accepted on %v, refused on %v, not checked on %v", user, accepted, refused, failed)
}

// onNoNode says why user is not refused by every Redis pod of rc ("" when every pod answered
// WRONGPASS: a pod that cannot be reached does not count as refusing).
func onNoNode(t *testing.T, rc *v1alpha1.RedisCluster, user, pass string) string {
	t.Helper()
	accepted, refused, failed := nodeLogins(t, rc, user, pass)
	if len(accepted)+len(failed) == 0 && len(refused) > 0 {
		return ""
	}
	return fmt.Sprintf("user %s: accepted on %v, refused on %v, not checked on %v", user, accepted, refused, failed)
}

// leaseLife is what the watch learned of one lease of a ledger.
type leaseLife struct {
	cluster, accessor string
	firstSeen         time.Time
	// leftLedger is when keyroll took it out of the ledger (revoked it); zero while it is there.
	leftLedger time.Time
	// missingSince is when Vault stopped knowing it while it was still in the ledger.
	missingSince time.Time
}

// ledgerWatch samples, once a second, the ledgers of some RedisClusters against Vault: every
// lease in a ledger exists in Vault (as root sees it), and the credential in each credentials
// Secret authenticates, on the Redis Vault created its user on and on every Redis pod of its
// cluster. It records each lease's life, the credential versions and the reasons they were
// issued for, and the ends of the connection's tokens.
type ledgerWatch struct {
	t          *testing.T
	clusters   []*v1alpha1.RedisCluster
	connection string

	mu       sync.Mutex
	leases   map[string]*leaseLife
	versions map[string][]string // per cluster, in order
	// reasons are the status.credential.rotationReason of each credential version.
	reasons   map[string]string
	tokenEnds map[string]time.Time
	failures  []string
	samples   int
}

func watchLedgers(t *testing.T, connection string, clusters ...*v1alpha1.RedisCluster) *ledgerWatch {
	return &ledgerWatch{t: t, clusters: clusters, connection: connection, leases: map[string]*leaseLife{},
		versions: map[string][]string{}, reasons: map[string]string{}, tokenEnds: map[string]time.Time{}}
}

// run samples for d; a superseded lease may be missing from Vault for a moment while keyroll's
// revocation of it is written to the ledger, never longer than revokeWindow.
func (w *ledgerWatch) run(d time.Duration) {
	const revokeWindow = 5 * time.Second
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Second) {
		w.sample(revokeWindow)
	}
}

func (w *ledgerWatch) fail(format string, args ...any) {
	w.failures = append(w.failures, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

func (w *ledgerWatch) sample(revokeWindow time.Duration) {
	t := w.t
	now := time.Now()
	vc := getConnection(t, w.connection)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples++
	for _, tok := range vc.Status.Tokens {
		if tok.EndsAt != nil {
			w.tokenEnds[tok.Accessor] = tok.EndsAt.Time
		}
	}
	for _, rc := range w.clusters {
		cur := get(t, rc)
		inLedger := map[string]bool{}
		for _, l := range cur.Status.Leases {
			inLedger[l.LeaseID] = true
			life := w.leases[l.LeaseID]
			if life == nil {
				life = &leaseLife{cluster: rc.Name, accessor: l.TokenAccessor, firstSeen: now}
				w.leases[l.LeaseID] = life
			}
			if exists, _ := ground.Vault.LeaseExpiry(l.LeaseID); exists {
				life.missingSince = time.Time{}
				continue
			}
			if life.missingSince.IsZero() {
				life.missingSince = now
			}
			if l.State == v1alpha1.LeaseActive || now.Sub(life.missingSince) > revokeWindow {
				w.fail("%s: lease %s (%s) is in the ledger but Vault no longer knows it", rc.Name, l.LeaseID, l.State)
			}
		}
		for id, life := range w.leases {
			if life.cluster == rc.Name && !inLedger[id] && life.leftLedger.IsZero() {
				life.leftLedger = now
			}
		}
		if c := cur.Status.Credential; c != nil {
			if vs := w.versions[rc.Name]; len(vs) == 0 || vs[len(vs)-1] != c.Version {
				w.versions[rc.Name] = append(vs, c.Version)
			}
			w.reasons[c.Version] = c.RotationReason
		}
		user, pass, ok := credentials(t, rc)
		problem := credentialProblem(t, rc, user, pass, ok)
		if problem != "" {
			// A rotation retires the old user right after the Secret changed: only the credential
			// the Secret holds after the check counts.
			if u, p, ok := credentials(t, rc); ok && (u != user || p != pass) {
				problem = credentialProblem(t, rc, u, p, ok)
			}
		}
		if problem != "" {
			w.fail("%s: %s", rc.Name, problem)
		}
	}
}

// credentialProblem says why the credential of rc's credentials Secret does not work ("" when it
// does): on the Redis Vault created its user on, and on every Redis pod of rc.
func credentialProblem(t *testing.T, rc *v1alpha1.RedisCluster, user, pass string, ok bool) string {
	t.Helper()
	switch {
	case !ok:
		return "no credentials Secret"
	case !authenticates(user, pass):
		return fmt.Sprintf("the credential in the credentials Secret (user %q) does not authenticate on Vault's Redis", user)
	}
	if msg := onEveryNode(t, rc, user, pass); msg != "" {
		return "the credential in the credentials Secret does not work on every Redis pod: " + msg
	}
	return ""
}

// check fails the test with what the watch found wrong.
func (w *ledgerWatch) check() {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.failures) > 0 {
		w.t.Fatalf("%d of %d samples found problems:\n%s", len(w.failures), w.samples, strings.Join(w.failures, "\n"))
	}
}
