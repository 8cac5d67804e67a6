package credential

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	testclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

var epoch = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// tokenLife is how long a bounded token lives from epoch; the leases live ten minutes.
const tokenLife = time.Minute

// sourceHarness drives Issuer.Credential on one RedisCluster with the fake client, the fake clock
// and the Vault fake, keeping the state Secret as the RedisCluster reconciler does. The fake's
// token ends tokenEnds after epoch (zero: a periodic token, with no end).
type sourceHarness struct {
	src   *Issuer
	k8s   client.Client
	vault *vaulttest.Fake
	clock *testclock.FakeClock
	key   client.ObjectKey
}

func newSourceHarness(t *testing.T, tokenEnds time.Duration) *sourceHarness {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1beta1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	rc := &v1beta1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: "rc-uid", Generation: 1},
		Spec: v1beta1.RedisClusterSpec{Credentials: v1beta1.CredentialsSpec{
			Source: v1beta1.SourceVaultLease,
			VaultLease: &v1beta1.VaultLeaseSource{ConnectionRef: v1beta1.ConnectionReference{Name: "vault"},
				Path: "database/creds/orders", RenewalPercent: 67},
		}},
	}
	k8s := fake.NewClientBuilder().WithScheme(s).WithObjects(rc).WithStatusSubresource(&v1beta1.RedisCluster{}).Build()
	clk := testclock.NewFakeClock(epoch)
	fv := vaulttest.New(clk)
	fv.LeaseDuration = 10 * time.Minute
	if tokenEnds > 0 {
		fv.TokenDeadline = epoch.Add(tokenEnds)
	}
	m := metrics.For(clk)
	src := &Issuer{Client: k8s, APIReader: k8s, Clock: clk, Metrics: m,
		Ledger: &Ledger{Clock: clk, Metrics: m, Checks: NewLeaseChecks(DefaultLeaseCheckInterval)}}
	return &sourceHarness{src: src, k8s: k8s, vault: fv, clock: clk, key: client.ObjectKeyFromObject(rc)}
}

func (h *sourceHarness) get(t *testing.T) *v1beta1.RedisCluster {
	t.Helper()
	rc := &v1beta1.RedisCluster{}
	if err := h.k8s.Get(context.Background(), h.key, rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

// credential runs Issuer.Credential once, then keeps the credential it returns in the state
// Secret, where the next run reads it from.
// statusUpdate writes a cluster's status as it is.
type statusUpdate struct{ c client.Client }

func (u statusUpdate) WriteStatus(ctx context.Context, cl *Cluster) error {
	return u.c.Status().Update(ctx, cl.RC)
}

func (h *sourceHarness) credential(t *testing.T) *v1beta1.RedisCluster {
	t.Helper()
	ctx := context.Background()
	rc := h.get(t)
	cl := &Cluster{RC: rc,
		Conds:  status.Setter{Obj: rc, Conditions: &rc.Status.Conditions, Recorder: events.NewFakeRecorder(16)},
		Status: statusUpdate{h.k8s},
	}
	if rc.Spec.Rotation.Schedule != "" {
		cl.ParseRotation()
	}
	cred, _, err := h.src.Credential(ctx, cl, h.vault)
	if err != nil {
		t.Fatalf("Credential: %v", err)
	}
	if cred == nil {
		t.Fatal("Credential returned no credential")
	}
	if err := h.k8s.Status().Update(ctx, rc); err != nil {
		t.Fatal(err)
	}
	sec := render.StateSecret(rc, "admin-password", cred)
	sec.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(rc, v1beta1.GroupVersion.WithKind("RedisCluster"))}
	if err := h.k8s.Delete(ctx, sec); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	if err := h.k8s.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	return h.get(t)
}

// TestRotationReasonSaysWhyTheCurrentCredentialWasIssued: status.credential.rotationReason is
// the reason of the issue or rotation that produced the credential in use, and stays with it.
func TestRotationReasonSaysWhyTheCurrentCredentialWasIssued(t *testing.T) {
	for name, tc := range map[string]struct {
		// then happens after the first credential is issued, before Credential runs again.
		then       func(t *testing.T, h *sourceHarness)
		tokenEnds  time.Duration
		want       rotation.Reason
		newVersion bool
		wantLeases int
	}{
		"nothing due keeps the first credential's reason": {
			then:       func(t *testing.T, h *sourceHarness) { h.clock.Step(10 * time.Second) },
			want:       rotation.ReasonNoCredential,
			wantLeases: 1,
		},
		"the token ending before the lease": {
			then:       func(t *testing.T, h *sourceHarness) { h.clock.Step(tokenLife - 2*time.Second) },
			tokenEnds:  tokenLife,
			want:       rotation.ReasonTokenEnding,
			newVersion: true, wantLeases: 2,
		},
		"a rotate-now request": {
			then: func(t *testing.T, h *sourceHarness) {
				rc := h.get(t)
				rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "1"}
				if err := h.k8s.Update(context.Background(), rc); err != nil {
					t.Fatal(err)
				}
			},
			want:       rotation.ReasonRotateNowRequested,
			newVersion: true, wantLeases: 2,
		},
		"a lease revoked outside keyroll": {
			then: func(t *testing.T, h *sourceHarness) {
				h.vault.RevokeOutside(h.get(t).Status.Credential.Lease.LeaseID)
				h.clock.Step(2 * DefaultLeaseCheckInterval) // the lease check finds it gone
			},
			want:       rotation.ReasonLeaseGone,
			newVersion: true, wantLeases: 1,
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newSourceHarness(t, tc.tokenEnds)
			first := h.credential(t).Status.Credential
			if first.RotationReason != string(rotation.ReasonNoCredential) {
				t.Fatalf("first credential: rotationReason %q, want %s", first.RotationReason, rotation.ReasonNoCredential)
			}
			tc.then(t, h)
			rc := h.credential(t)
			cur := rc.Status.Credential
			if got := cur.Version != first.Version; got != tc.newVersion {
				t.Fatalf("new credential issued = %v, want %v", got, tc.newVersion)
			}
			if cur.RotationReason != string(tc.want) {
				t.Errorf("rotationReason %q, want %s", cur.RotationReason, tc.want)
			}
			if len(rc.Status.Leases) != tc.wantLeases {
				t.Errorf("ledger %+v, want %d leases", rc.Status.Leases, tc.wantLeases)
			}
		})
	}
}
