package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(now.Add(d))) }

// rolling is a RedisCluster in the middle of a rotation that restarts its Redis pods
// (rollout.redisPods Restart): a new Active lease, the superseded one still live, every node
// confirmed with the new user, one of three pods updated and one in flight.
func rolling(namespace, name string) *v1beta1.RedisCluster {
	return &v1beta1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
			Annotations: map[string]string{v1beta1.AnnotationRotateNow: "1"}},
		Spec: v1beta1.RedisClusterSpec{
			Replicas: 3,
			Credentials: v1beta1.CredentialsSpec{Source: v1beta1.SourceVaultLease, VaultLease: &v1beta1.VaultLeaseSource{
				ConnectionRef: v1beta1.ConnectionReference{Name: "vault"}, Path: "database/creds/orders"}},
			Rotation: v1beta1.RotationSpec{Schedule: "0 3 * * *"},
			Rollout: v1beta1.RolloutSpec{RedisPods: v1beta1.RedisPodsRestart,
				Consumers: []v1beta1.ConsumerReference{{Kind: "Deployment", Name: "orders-api"}}},
		},
		Status: v1beta1.RedisClusterStatus{
			Phase: v1beta1.PhaseRolling, ReadyReplicas: 3, RotateNowAcknowledged: "1", Primary: name + "-1",
			Nodes: []v1beta1.NodeStatus{
				{Pod: name + "-0", UsersVersion: "u2hash", ConfirmedAt: at(-30 * time.Second)},
				{Pod: name + "-1", UsersVersion: "u2hash", ConfirmedAt: at(-30 * time.Second)},
				{Pod: name + "-2", UsersVersion: "u2hash", ConfirmedAt: at(-30 * time.Second)},
			},
			Conditions: []metav1.Condition{{Type: v1beta1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1beta1.ReasonAvailable,
				Message: "credential issued", LastTransitionTime: *at(-5 * time.Minute)}},
			Credential: &v1beta1.CredentialStatus{
				Version: "v2hash", Source: v1beta1.SourceVaultLease, Username: "V_TOKEN_ORDERS_NEW",
				IssuedAt:     at(-time.Minute),
				Lease:        v1beta1.CredentialLease{LeaseID: "database/creds/orders/new", ExpiresAt: at(9 * time.Minute), Renewable: true, NextRenewal: at(5 * time.Minute)},
				VaultLease:   v1beta1.VaultLeaseCredential{TokenAccessor: "acc-new"},
				LastRotation: at(-time.Minute), NextRotation: at(15 * time.Hour),
			},
			Leases: []v1beta1.LeaseRecord{
				{LeaseID: "database/creds/orders/new", State: v1beta1.LeaseActive, Version: "v2hash", Connection: "vault", TokenAccessor: "acc-new", ExpiresAt: at(9 * time.Minute)},
				{LeaseID: "database/creds/orders/old", State: v1beta1.LeaseSuperseded, Version: "v1hash", Connection: "vault", TokenAccessor: "acc-old", ExpiresAt: at(3 * time.Minute)},
			},
			Rollout: &v1beta1.RolloutStatus{TargetVersion: "v2hash", PodsUpdated: 1, PodInFlight: name + "-1",
				PodRestartedAt: at(-20 * time.Second), StartedAt: at(-time.Minute)},
		},
	}
}

type env struct {
	c client.Client
}

func newEnv(t *testing.T, objs ...client.Object) *env {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1beta1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&v1beta1.RedisCluster{}).WithObjects(objs...).Build()
	return &env{c: c}
}

// run runs the plugin with args against the fake client, in namespace "default" unless -n.
func (e *env) run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	o := &options{
		streams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
		flags:   genericclioptions.NewConfigFlags(true),
		now:     func() time.Time { return now },
	}
	o.newClient = func() (client.Client, string, error) {
		ns := "default"
		if o.flags.Namespace != nil && *o.flags.Namespace != "" {
			ns = *o.flags.Namespace
		}
		return e.c, ns, nil
	}
	cmd := o.command()
	cmd.SetArgs(args)
	err = cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

func (e *env) get(t *testing.T, namespace, name string) *v1beta1.RedisCluster {
	t.Helper()
	rc := &v1beta1.RedisCluster{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

func TestStatusShowsLedgerRolloutAndSchedule(t *testing.T) {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "orders-credentials"},
		Data: map[string][]byte{"username": []byte("V_TOKEN_ORDERS_NEW"), "password": []byte("hunter2-secret")}}
	e := newEnv(t, rolling("default", "orders"), secret)
	out, _, err := e.run(t, "status", "orders")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`orders-1\s+primary\s+u2hash`).MatchString(out) || !regexp.MustCompile(`orders-0\s+replica\s+u2hash`).MatchString(out) {
		t.Errorf("status does not show orders-1 as the primary and orders-0 as a replica:\n%s", out)
	}
	for _, want := range []string{
		"default/orders", "Phase:", "Rolling", "3/3 ready", "database/creds/orders through VaultConnection vault",
		`schedule "0 3 * * *"`,
		"Ready", "True", "Available", "5m", "credential issued",
		"v2hash", "V_TOKEN_ORDERS_NEW", "acc-new",
		"Next renewal:", "2026-12-01T12:05:00Z (in 5m)", "Next rotation:", "2026-12-02T03:00:00Z (in 15h)",
		"Delivered:", "not yet", // rolling out
		"database/creds/orders/old", "Superseded", "acc-old", "2026-12-01T12:03:00Z (in 3m)",
		"Active", "to version v2hash: 1/3 Redis pods updated, orders-1 in flight (restarted 20s ago), 0/1 consumers updated, started 60s ago",
		"Redis nodes:", "orders-2", "u2hash", "30s ago",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not show %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hunter2") {
		t.Errorf("status shows the password:\n%s", out)
	}
}

// In Live mode (the default) a rotation restarts no Redis pod: the rollout line says that every
// node accepts the new credential and counts the consumers, and the users still to retire are
// named.
func TestStatusInLiveModeShowsTheNodesNotPodRestarts(t *testing.T) {
	rc := rolling("default", "orders")
	rc.Spec.Rollout.RedisPods = v1beta1.RedisPodsLive
	rc.Status.Rollout = &v1beta1.RolloutStatus{TargetVersion: "v2hash", ConsumersUpdated: 1, StartedAt: at(-time.Minute)}
	rc.Status.RetiringUsers = []string{"V_TOKEN_ORDERS_OLD"}
	out, _, err := newEnv(t, rc).run(t, "status", "orders")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"to version v2hash, which every Redis node accepts: 1/1 consumers updated, started 60s ago",
		"orders-0", "orders-1", "orders-2", "users still to remove from every node: V_TOKEN_ORDERS_OLD",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not show %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Redis pods updated") {
		t.Errorf("a Live rollout is shown as restarting Redis pods:\n%s", out)
	}
}

// The clients that hold the retirement of a superseded user are listed, each by workload or
// address.
func TestStatusShowsWhoStillUsesTheOldCredential(t *testing.T) {
	rc := rolling("default", "orders")
	rc.Status.OldUserClients = []v1beta1.OldUserClient{
		{User: "V_OLD", Workload: "Deployment/report", Address: "10.0.0.9", Connections: 3, Since: at(-2 * time.Minute)},
		{User: "V_OLD", Address: "192.0.2.7", Connections: 1, Since: at(-time.Minute)},
	}
	out, _, err := newEnv(t, rc).run(t, "status", "orders")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Still logged in with a superseded user", "Deployment/report", "10.0.0.9", "192.0.2.7", "V_OLD"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not show %q:\n%s", want, out)
		}
	}
}

// The consumers of the last rollout are listed with how keyroll knows each, and whether it
// restarts it.
func TestStatusShowsTheConsumersUsed(t *testing.T) {
	rc := rolling("default", "orders")
	rc.Status.Consumers = []v1beta1.ConsumerInUse{
		{Kind: "Deployment", Name: "api", Via: v1beta1.ConsumerListed, Restarted: true},
		{Kind: "StatefulSet", Name: "worker", Via: v1beta1.ConsumerDiscovered, References: []string{"volume creds"}, Restarted: true},
		{Kind: "CronJob", Name: "report", Via: v1beta1.ConsumerDiscovered, References: []string{"envFrom of container app"}},
	}
	out, _, err := newEnv(t, rc).run(t, "status", "orders")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Consumers of the last rollout", "Deployment/api", "Listed", "StatefulSet/worker", "volume creds", "CronJob/report", "Discovered", "no"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not show %q:\n%s", want, out)
		}
	}
}

func TestStatusOfAFreshClusterSaysWhatIsMissing(t *testing.T) {
	rc := rolling("default", "fresh")
	rc.Status = v1beta1.RedisClusterStatus{}
	rc.Annotations = nil
	out, _, err := newEnv(t, rc).run(t, "status", "fresh")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Phase:", "-", "none yet", "none issued yet", "none in the ledger", "none confirmed yet", "none in progress"} {
		if !strings.Contains(out, want) {
			t.Errorf("status of a fresh cluster does not say %q:\n%s", want, out)
		}
	}
}

func TestStatusAsJSONAndYAML(t *testing.T) {
	e := newEnv(t, rolling("default", "orders"))
	out, _, err := e.run(t, "status", "orders", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v clusterView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("-o json is not JSON: %v\n%s", err, out)
	}
	if v.Name != "orders" || v.Phase != v1beta1.PhaseRolling || len(v.Leases) != 2 || v.Leases[1].State != v1beta1.LeaseSuperseded ||
		v.Rollout == nil || v.Rollout.PodsUpdated != 1 || v.Credential == nil || v.Credential.Lease.NextRenewal == nil || v.Rotation.Pending {
		t.Errorf("-o json: %+v", v)
	}
	out, _, err = e.run(t, "status", "orders", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	v = clusterView{}
	if err := yaml.Unmarshal([]byte(out), &v); err != nil || v.Credential == nil || v.Credential.VaultLease.TokenAccessor != "acc-new" {
		t.Errorf("-o yaml: %v %+v\n%s", err, v, out)
	}
	if _, _, err := e.run(t, "status", "orders", "-o", "wide"); err == nil || !strings.Contains(err.Error(), `unknown output format "wide"`) {
		t.Errorf("-o wide: %v", err)
	}
}

func TestStatusOfAMissingCluster(t *testing.T) {
	_, _, err := newEnv(t).run(t, "status", "nope")
	if err == nil || !strings.Contains(err.Error(), `"nope" not found`) {
		t.Errorf("status of a missing cluster: %v", err)
	}
}

func TestRotateSetsANewRotateNowValueEachTime(t *testing.T) {
	e := newEnv(t, rolling("default", "orders"))
	out, _, err := e.run(t, "rotate", "orders")
	if err != nil {
		t.Fatal(err)
	}
	first := e.get(t, "default", "orders").Annotations[v1beta1.AnnotationRotateNow]
	if first == "" || first == "1" || !strings.Contains(out, "rotation requested (keyroll.dev/rotate-now="+first+")") {
		t.Fatalf("rotate set %q and said:\n%s", first, out)
	}
	if _, _, err := e.run(t, "rotate", "orders"); err != nil {
		t.Fatal(err)
	}
	if second := e.get(t, "default", "orders").Annotations[v1beta1.AnnotationRotateNow]; second == first {
		t.Errorf("a second rotate at the same instant reused the value %q", second)
	}
	out, _, _ = e.run(t, "status", "orders")
	if !strings.Contains(out, "requested, not yet acted upon") {
		t.Errorf("status does not show the pending request:\n%s", out)
	}
}

func TestRotateWaitsUntilAcknowledged(t *testing.T) {
	e := newEnv(t, rolling("default", "orders"))
	done := make(chan struct{})
	go func() {
		defer close(done)
		// keyroll's part: acknowledge the request once it is there.
		for range 100 {
			rc := &v1beta1.RedisCluster{}
			_ = e.c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "orders"}, rc)
			if v := rc.Annotations[v1beta1.AnnotationRotateNow]; v != "1" {
				rc.Status.RotateNowAcknowledged = v
				rc.Status.Credential.Version = "v3hash"
				_ = e.c.Status().Update(context.Background(), rc)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	out, _, err := e.run(t, "rotate", "orders", "--wait", "--timeout=10s")
	<-done
	if err != nil || !strings.Contains(out, "rotated: credential version v3hash") {
		t.Errorf("rotate --wait: %v\n%s", err, out)
	}
	if _, _, err := e.run(t, "rotate", "orders", "--wait", "--timeout=1s"); err == nil || !strings.Contains(err.Error(), "has not acted") {
		t.Errorf("rotate --wait with nobody acting: %v", err)
	}
}

func TestPauseAndResume(t *testing.T) {
	e := newEnv(t, rolling("default", "orders"))
	out, _, err := e.run(t, "pause", "orders")
	if err != nil || !e.get(t, "default", "orders").Spec.Rotation.Paused || !strings.Contains(out, "rotations paused") {
		t.Fatalf("pause: %v, %s", err, out)
	}
	out, _, _ = e.run(t, "pause", "orders")
	if !strings.Contains(out, "already paused") {
		t.Errorf("pause twice: %s", out)
	}
	out, _, _ = e.run(t, "rotate", "orders")
	if !strings.Contains(out, "rotations are paused") {
		t.Errorf("rotate while paused does not say so: %s", out)
	}
	out, _, err = e.run(t, "resume", "orders")
	if err != nil || e.get(t, "default", "orders").Spec.Rotation.Paused || !strings.Contains(out, "rotations resumed") {
		t.Fatalf("resume: %v, %s", err, out)
	}
	if e.get(t, "default", "orders").Spec.Rotation.Schedule != "0 3 * * *" {
		t.Error("pause/resume changed the schedule")
	}
}

func TestLeasesInANamespaceAndInAll(t *testing.T) {
	other := rolling("shop", "carts")
	other.Status.Leases = other.Status.Leases[:1]
	other.Status.Leases[0].LeaseID = "database/creds/carts/one"
	e := newEnv(t, rolling("default", "orders"), other)
	out, _, err := e.run(t, "leases")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "database/creds/orders/old") || strings.Contains(out, "carts") || strings.Contains(out, "NAMESPACE") {
		t.Errorf("leases in default:\n%s", out)
	}
	out, _, _ = e.run(t, "leases", "-A")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "NAMESPACE") || !strings.Contains(out, "shop") || !strings.Contains(out, "Superseded") {
		t.Errorf("leases -A:\n%s", out)
	}
	out, _, _ = e.run(t, "leases", "-A", "-o", "json")
	var list leaseList
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 3 || list.Items[2].Namespace != "shop" || list.Items[2].Cluster != "carts" {
		t.Errorf("leases -A -o json: %v %+v", err, list)
	}
	_, errOut, err := e.run(t, "leases", "-n", "empty")
	if err != nil || !strings.Contains(errOut, "No leases held by keyroll in namespace empty") {
		t.Errorf("leases in an empty namespace: %v %q", err, errOut)
	}
}
