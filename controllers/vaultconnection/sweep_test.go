package vaultconnection

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/vault"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

// oneClient hands out the same Vault fake for every VaultConnection.
type oneClient struct{ f *vaulttest.Fake }

func (o oneClient) Get(string, vault.Config) (connection.Client, error) { return o.f, nil }
func (oneClient) Forget(string)                                         {}

// cluster is a RedisCluster of connection "vault" reading path, holding leases in its ledger.
func cluster(name string, source v1beta1.CredentialSource, path string, leases ...string) *v1beta1.RedisCluster {
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name}}
	rc.Spec.Credentials.Source = source
	ref := v1beta1.ConnectionReference{Name: "vault"}
	if source == v1beta1.SourceVaultLease {
		rc.Spec.Credentials.VaultLease = &v1beta1.VaultLeaseSource{ConnectionRef: ref, Path: path}
	} else {
		rc.Spec.Credentials.ExternalSecret = &v1beta1.ExternalSecretSource{ConnectionRef: &ref}
	}
	for _, id := range leases {
		rc.Status.Leases = append(rc.Status.Leases, v1beta1.LeaseRecord{LeaseID: id, State: v1beta1.LeaseActive})
	}
	return rc
}

// The sweep reports a lease under a cluster's path that no ledger holds and that is older than
// the grace period, and (action Revoke) revokes it when this install recorded its issue (an
// intent); it leaves alone a lease in a ledger, a lease issued within the grace period, a lease
// obtained on the same path by anyone else (no intent), and the leases under a path that External
// Secrets Operator's clusters read. It runs once per interval; Off clears its status.
func TestSweepOrphans(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	vf := vaulttest.New(clk)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1beta1.AddToScheme(scheme)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "keyroll", Name: "tok"}, Data: map[string][]byte{"token": []byte("t")}},
	).Build()
	intents := &connection.Intents{Writer: c, Reader: c, Namespace: "keyroll", Clock: clk}
	// issue obtains a lease as keyroll does (recording its intent first) or, without keyroll,
	// as another install or a person would.
	issue := func(path string, keyroll bool) string {
		if keyroll {
			if _, err := intents.Record(ctx, "vault", path, types.NamespacedName{Namespace: "apps", Name: "orders"}); err != nil {
				t.Fatal(err)
			}
		}
		l, err := vf.Issue(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		return l.ID
	}
	held, orphan, foreign := issue("database/creds/orders", false), issue("database/creds/orders", true), issue("database/creds/orders", false)
	esHeld, esUnseen := issue("database/creds/es", false), issue("database/creds/es", false)
	clk.Step(10 * time.Minute)
	young := issue("database/creds/orders", true)

	vc := &v1beta1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: "vault"}}
	vc.Spec.Address = "http://127.0.0.1:8200"
	vc.Spec.AllowedNamespaces, vc.Spec.AllowedPaths = []string{"*"}, []string{"database/creds/*"}
	vc.Spec.Auth.Token = &v1beta1.TokenAuth{SecretRef: v1beta1.SecretKeyReference{Namespace: "keyroll", Name: "tok", Key: "token"}}
	vc.Spec.OrphanLeases = &v1beta1.OrphanLeases{Action: v1beta1.OrphanLeasesReport, GracePeriod: &metav1.Duration{Duration: time.Minute}}
	meta.SetStatusCondition(&vc.Status.Conditions, metav1.Condition{Type: v1beta1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1beta1.ReasonLoggedIn})
	for _, rc := range []*v1beta1.RedisCluster{
		cluster("orders", v1beta1.SourceVaultLease, "database/creds/orders", held),
		cluster("es", v1beta1.SourceExternalSecret, "", esHeld),
	} {
		if err := c.Create(ctx, rc); err != nil {
			t.Fatal(err)
		}
	}
	rec := events.NewFakeRecorder(20)
	r := &Reconciler{Client: c, Recorder: rec, Clock: clk, Metrics: metrics.For(clk),
		Connector: &connection.Connector{Reader: c, Clients: oneClient{vf}, Clock: clk, Intents: intents}}

	next, err := r.sweepOrphans(ctx, vc)
	if err != nil {
		t.Fatal(err)
	}
	st := vc.Status.OrphanLeases
	both := []string{orphan, foreign}
	slices.Sort(both)
	if st == nil || st.Found != 2 || st.Foreign != 1 || !slices.Equal(st.Orphans, both) || st.Revoked != 0 {
		t.Fatalf("Report: status %+v, want the orphans %v found (one foreign) and none revoked", st, both)
	}
	if !slices.Equal(st.Paths, []string{"database/creds/orders"}) {
		t.Errorf("swept paths %v: the ExternalSecret cluster's path must not be swept", st.Paths)
	}
	if !slices.Contains(vf.Leases(), orphan) {
		t.Error("Report revoked the orphan")
	}
	if e := drain(rec); !strings.Contains(e, v1beta1.EventOrphanLeasesFound) || !strings.Contains(e, orphan) {
		t.Errorf("events %q, want %s naming the orphan", e, v1beta1.EventOrphanLeasesFound)
	}
	if next != defaultOrphanInterval {
		t.Errorf("next sweep in %s, want the default interval %s", next, defaultOrphanInterval)
	}

	vc.Spec.OrphanLeases.Action = v1beta1.OrphanLeasesRevoke
	clk.Step(time.Minute)
	if next, err := r.sweepOrphans(ctx, vc); err != nil || next != defaultOrphanInterval-time.Minute || !slices.Contains(vf.Leases(), orphan) {
		t.Fatalf("a sweep before its interval: next %s, err %v, leases %v; want nothing done", next, err, vf.Leases())
	}
	clk.Step(defaultOrphanInterval)
	young2 := issue("database/creds/orders", true) // young has aged past the grace period meanwhile
	if _, err := r.sweepOrphans(ctx, vc); err != nil {
		t.Fatal(err)
	}
	want := []string{held, foreign, esHeld, esUnseen, young2}
	slices.Sort(want)
	if got := vf.Leases(); !slices.Equal(got, want) {
		t.Errorf("after the Revoke sweep Vault holds %v, want %v (only keyroll's orphans revoked)", got, want)
	}
	if st := vc.Status.OrphanLeases; st.Revoked != 2 || st.Found != 1 || st.Foreign != 1 {
		t.Errorf("Revoke: status %+v, want two revoked (%s, %s), the foreign one left", st, orphan, young)
	}
	if open, err := intents.Open(ctx, "vault"); err != nil || len(open) != 1 {
		t.Errorf("intents left %+v (%v), want young2's alone: the revoked orphans' dropped", open, err)
	}
	if e := drain(rec); !strings.Contains(e, v1beta1.EventOrphanLeaseRevoked) {
		t.Errorf("events %q, want %s", e, v1beta1.EventOrphanLeaseRevoked)
	}

	// Without the list policy, the sweep says what is missing, once.
	vf.SetFailure(vaulttest.OpListLeases, vaulttest.Err("list-leases", vault.ClassPermissionDenied))
	for range 2 {
		clk.Step(defaultOrphanInterval)
		if _, err := r.sweepOrphans(ctx, vc); err != nil {
			t.Fatal(err)
		}
	}
	if st := vc.Status.OrphanLeases; !strings.Contains(st.Error, "list and sudo on sys/leases/lookup/") || !strings.Contains(st.Error, "deploy/vault/sweeper-policy.hcl") {
		t.Errorf("a refused list: status error %q, want it to name the policy", st.Error)
	}
	if e := drain(rec); strings.Count(e, v1beta1.EventOrphanSweepFailed) != 1 {
		t.Errorf("events %q, want one %s", e, v1beta1.EventOrphanSweepFailed)
	}

	vc.Spec.OrphanLeases.Action = v1beta1.OrphanLeasesOff
	if next, _ := r.sweepOrphans(ctx, vc); next != 0 || vc.Status.OrphanLeases != nil {
		t.Errorf("Off: next %s, status %+v; want no sweep and no status", next, vc.Status.OrphanLeases)
	}
}

// drain returns the events recorded so far, one per line.
func drain(rec *events.FakeRecorder) string {
	var b strings.Builder
	for {
		select {
		case e := <-rec.Events:
			b.WriteString(e + "\n")
		default:
			return b.String()
		}
	}
}
