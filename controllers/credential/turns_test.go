package credential

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	testclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/vault"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

// limitedVault is the Vault fake behind a rate limiter, waited for before every lease request as
// the real client waits for its connection's (vault.Config.RateLimit); waiting counts the requests
// waiting for it now.
type limitedVault struct {
	*vaulttest.Fake
	limiter *rate.Limiter
	waiting atomic.Int32
}

func (v *limitedVault) wait(ctx context.Context, op string) error {
	v.waiting.Add(1)
	defer v.waiting.Add(-1)
	if err := v.limiter.Wait(ctx); err != nil {
		return fmt.Errorf("%s: waiting for the rate limiter: %w", op, vaulttest.Err(op, vault.ClassUnavailable))
	}
	return nil
}

func (v *limitedVault) Issue(ctx context.Context, path string) (*vault.Lease, error) {
	if err := v.wait(ctx, vaulttest.OpIssue); err != nil {
		return nil, err
	}
	return v.Fake.Issue(ctx, path)
}

func (v *limitedVault) Renew(ctx context.Context, id string, increment time.Duration) (*vault.Renewal, error) {
	if err := v.wait(ctx, vaulttest.OpRenew); err != nil {
		return nil, err
	}
	return v.Fake.Renew(ctx, id, increment)
}

func (v *limitedVault) Lookup(ctx context.Context, id string) (*vault.LeaseInfo, error) {
	if err := v.wait(ctx, vaulttest.OpLookup); err != nil {
		return nil, err
	}
	return v.Fake.Lookup(ctx, id)
}

// limitedClients hands out one limitedVault per VaultConnection, its limiter made from the
// connection's settings once.
type limitedClients struct {
	fake *vaulttest.Fake
	mu   sync.Mutex
	by   map[string]*limitedVault
}

func (c *limitedClients) Get(name string, cfg vault.Config) (connection.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.by[name]; ok {
		return v, nil
	}
	v := &limitedVault{Fake: c.fake, limiter: rate.NewLimiter(rate.Limit(cfg.RateLimit.QPS), cfg.RateLimit.Burst)}
	c.by[name] = v
	return v, nil
}

func (*limitedClients) Forget(string) {}

// tenants are RedisClusters of several namespaces on one VaultConnection of 20 requests a second
// (burst 20), with Issuer.Credential run on each as its reconcile would.
type tenants struct {
	src     *Issuer
	k8s     client.Client
	vault   *vaulttest.Fake
	clients *limitedClients
	conn    *connection.Connector
}

func newTenants(t *testing.T, clusters map[string][]string) *tenants {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1beta1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	objs := []client.Object{&v1beta1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: "vault", UID: "vc-uid"}, Spec: v1beta1.VaultConnectionSpec{
		Address: "https://vault.example:8200", AllowedNamespaces: []string{"*"}, AllowedPaths: []string{"database/creds/*"},
		RateLimit: &v1beta1.VaultRateLimit{QPS: 20, Burst: 20},
		Auth:      v1beta1.VaultAuth{Kubernetes: &v1beta1.KubernetesAuth{Mount: "kubernetes", Role: "keyroll"}},
	}}}
	for ns, names := range clusters {
		for _, name := range names {
			objs = append(objs, &v1beta1.RedisCluster{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name), Generation: 1},
				Spec: v1beta1.RedisClusterSpec{Credentials: v1beta1.CredentialsSpec{
					Source: v1beta1.SourceVaultLease,
					VaultLease: &v1beta1.VaultLeaseSource{ConnectionRef: v1beta1.ConnectionReference{Name: "vault"},
						Path: "database/creds/" + ns, RenewalPercent: 67},
				}},
			})
		}
	}
	k8s := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&v1beta1.RedisCluster{}).Build()
	clk := testclock.NewFakeClock(epoch)
	fv := vaulttest.New(clk)
	fv.LeaseDuration = 10 * time.Minute
	clients := &limitedClients{fake: fv, by: map[string]*limitedVault{}}
	m := metrics.For(clk)
	// No lease lookups: what reaches Vault is the renewals and rotations each test makes due.
	src := &Issuer{Client: k8s, APIReader: k8s, Clock: clk, Metrics: m,
		Ledger: &Ledger{Clock: clk, Metrics: m, Checks: NewLeaseChecks(0)}}
	return &tenants{src: src, k8s: k8s, vault: fv, clients: clients, conn: &connection.Connector{Reader: k8s, Clients: clients, Clock: clk}}
}

// credential runs Issuer.Credential once for the cluster key, through the VaultConnection's client
// for its namespace (limited: false, the fake alone), and keeps what it returns as the RedisCluster
// reconciler does: the status, and the credential in the state Secret.
func (ts *tenants) credential(ctx context.Context, key client.ObjectKey, limited bool) (*v1beta1.RedisCluster, time.Duration, error) {
	rc := &v1beta1.RedisCluster{}
	if err := ts.k8s.Get(ctx, key, rc); err != nil {
		return nil, 0, err
	}
	var vcl vault.LeaseClient = ts.vault
	if limited {
		c, refusal, err := ts.conn.ClientFor(ctx, ts.k8s, connection.Use{Connection: "vault", Namespace: key.Namespace, Path: rc.Spec.Credentials.VaultLease.Path})
		if err != nil || refusal != nil {
			return nil, 0, fmt.Errorf("no Vault client: %v %v", err, refusal)
		}
		vcl = c
	}
	cl := &Cluster{RC: rc, Conds: status.Setter{Obj: rc, Conditions: &rc.Status.Conditions, Recorder: events.NewFakeRecorder(16)},
		Status: statusUpdate{ts.k8s}}
	cred, wait, err := ts.src.Credential(ctx, cl, vcl)
	if err != nil {
		return nil, 0, err
	}
	if err := ts.k8s.Status().Update(ctx, rc); err != nil {
		return nil, 0, err
	}
	sec := render.StateSecret(rc, "admin-password", cred)
	sec.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(rc, v1beta1.GroupVersion.WithKind("RedisCluster"))}
	if err := ts.k8s.Delete(ctx, sec); client.IgnoreNotFound(err) != nil {
		return nil, 0, err
	}
	return rc, wait, ts.k8s.Create(ctx, sec)
}

// Defect (issue 47): one namespace that asked many RedisClusters to rotate now took every token
// of the connection's rate limiter; another namespace's renewal, queued behind its issues, missed
// its deadline. Now a rotation that may wait takes its turn within its namespace's share of the
// rate, and the renewal goes through at once.
func TestRotateNowInOneNamespaceLeavesAnotherItsRenewals(t *testing.T) {
	const many = 100
	var names []string
	for i := range many {
		names = append(names, fmt.Sprintf("redis-%d", i))
	}
	ts := newTenants(t, map[string][]string{"team-a": names, "team-b": {"orders", "payments"}})
	ctx := context.Background()
	first := func(ns string, names ...string) {
		for _, n := range names {
			if _, _, err := ts.credential(ctx, client.ObjectKey{Namespace: ns, Name: n}, false); err != nil {
				t.Fatalf("first credential of %s/%s: %v", ns, n, err)
			}
		}
	}
	// team-b's leases are four minutes older than team-a's: theirs are due for renewal when
	// team-a asks for its rotations, team-a's not yet (whose renewals would be work that may not
	// wait either).
	clk := ts.src.Clock.(*testclock.FakeClock)
	first("team-b", "orders", "payments")
	clk.Step(4 * time.Minute)
	first("team-a", names...)
	clk.Step(4 * time.Minute)
	asked := []client.ObjectKey{{Namespace: "team-b", Name: "payments"}}
	for _, n := range names {
		asked = append(asked, client.ObjectKey{Namespace: "team-a", Name: n})
	}
	for _, key := range asked {
		rc := &v1beta1.RedisCluster{}
		if err := ts.k8s.Get(ctx, key, rc); err != nil {
			t.Fatal(err)
		}
		rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "1"}
		if err := ts.k8s.Update(ctx, rc); err != nil {
			t.Fatal(err)
		}
	}

	// team-a's reconciles run at once, each until it has asked Vault or was told to wait. The
	// deadlines are generous: under the race detector beside other tests a reconcile on the fake
	// client can take a while, and what is measured is who goes through, not how fast.
	began := time.Now()
	actx, cancel := context.WithTimeout(ctx, 90*time.Second)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }() // a failure below ends them rather than waiting
	var returned atomic.Int32
	waits := make([]time.Duration, many)
	errs := make([]error, many)
	for i, n := range names {
		wg.Go(func() {
			defer returned.Add(1)
			_, waits[i], errs[i] = ts.credential(actx, client.ObjectKey{Namespace: "team-a", Name: n}, true)
		})
	}
	deadline := time.Now().Add(60 * time.Second)
	for returned.Load()+waiting(ts) < many {
		if time.Now().After(deadline) {
			t.Fatalf("team-a's reconciles neither returned nor reached the rate limiter: %d returned, %d waiting", returned.Load(), waiting(ts))
		}
		time.Sleep(time.Millisecond)
	}

	// team-b's renewal, with two seconds to go through: behind team-a's requests at the
	// connection's 20 a second after its burst of 40, it would wait three (rate.Limiter refuses
	// at once a wait past the deadline).
	bctx, bcancel := context.WithTimeout(ctx, 2*time.Second)
	defer bcancel()
	start := time.Now()
	rc, _, err := ts.credential(bctx, client.ObjectKey{Namespace: "team-b", Name: "orders"}, true)
	if err != nil {
		t.Fatalf("team-b's renewal, behind %d of team-a's requests: %v", waiting(ts), err)
	}
	if rc.Status.Credential.Lease.LastRenewal == nil || time.Since(start) > 2*time.Second {
		t.Errorf("team-b's lease: lastRenewal %v after %s; want it renewed within its deadline", rc.Status.Credential.Lease.LastRenewal, time.Since(start))
	}
	// team-b's own rotate-now goes ahead too: team-a took its share, not every namespace's.
	rc, _, err = ts.credential(bctx, client.ObjectKey{Namespace: "team-b", Name: "payments"}, true)
	if err != nil || rc.Status.Credential.RotationReason != string(rotation.ReasonRotateNowRequested) {
		t.Errorf("team-b's rotate-now: %v, rotationReason %q; want it made", err, rc.Status.Credential.RotationReason)
	}

	cancel()
	wg.Wait()
	// The namespace's share refills at 5 a second while the reconciles run.
	most := 5 + int(5*time.Since(began).Seconds()+1)
	rotated := 0
	for i, n := range names {
		rc := &v1beta1.RedisCluster{}
		if err := ts.k8s.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: n}, rc); err != nil {
			t.Fatal(err)
		}
		switch {
		case rc.Status.RotateNowAcknowledged == "1":
			rotated++
		case errs[i] != nil:
			t.Errorf("team-a/%s: %v", n, errs[i])
		case waits[i] <= 0 || waits[i] > 30*time.Second:
			t.Errorf("team-a/%s: not rotated, and asked to look again in %s; want its turn within seconds", n, waits[i])
		}
	}
	if rotated < 5 || rotated > most {
		t.Errorf("team-a: %d rotations went ahead at once, want its burst of 5 (a quarter of 20) and at most %d with what its share refilled meanwhile", rotated, most)
	}
}

// A rotation that waits for its turn holds back nothing else: the lease's renewal, due at the same
// time, is made meanwhile, and the rotation comes with its turn.
func TestRotationWaitingForItsTurnStillRenews(t *testing.T) {
	names := []string{"redis-0", "redis-1", "redis-2", "redis-3", "redis-4", "redis-5", "redis-6", "redis-7"}
	ts := newTenants(t, map[string][]string{"team-a": names})
	ctx := context.Background()
	for _, n := range names {
		if _, _, err := ts.credential(ctx, client.ObjectKey{Namespace: "team-a", Name: n}, false); err != nil {
			t.Fatal(err)
		}
	}
	clk := ts.src.Clock.(*testclock.FakeClock)
	clk.Step(8 * time.Minute) // every renewal is due
	for _, n := range names {
		rc := &v1beta1.RedisCluster{}
		if err := ts.k8s.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: n}, rc); err != nil {
			t.Fatal(err)
		}
		rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "1"}
		if err := ts.k8s.Update(ctx, rc); err != nil {
			t.Fatal(err)
		}
	}

	var longest time.Duration
	for _, n := range names {
		rc, wait, err := ts.credential(ctx, client.ObjectKey{Namespace: "team-a", Name: n}, true)
		if err != nil {
			t.Fatal(err)
		}
		if rc.Status.RotateNowAcknowledged == "1" {
			continue // its turn: rotated
		}
		if c := rc.Status.Credential; c.Lease.LastRenewal == nil || wait <= 0 {
			t.Errorf("%s waits %s for its turn; lastRenewal %v: want the lease renewed meanwhile", n, wait, c.Lease.LastRenewal)
		}
		longest = max(longest, wait)
	}
	clk.Step(longest)
	for _, n := range names {
		if rc, _, err := ts.credential(ctx, client.ObjectKey{Namespace: "team-a", Name: n}, true); err != nil || rc.Status.RotateNowAcknowledged != "1" {
			t.Errorf("%s after %s: %v, rotate-now acknowledged %q; want it rotated with its turn", n, longest, err, rc.Status.RotateNowAcknowledged)
		}
	}
}

// waiting counts the requests waiting for the connection's rate limiter now.
func waiting(ts *tenants) int32 {
	ts.clients.mu.Lock()
	defer ts.clients.mu.Unlock()
	n := int32(0)
	for _, v := range ts.clients.by {
		n += v.waiting.Load()
	}
	return n
}
