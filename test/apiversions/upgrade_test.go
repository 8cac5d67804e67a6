package apiversions

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/diff"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/conversion"
	"github.com/keyroll/keyroll/test/framework"
)

var (
	alphaClusters    = schema.GroupVersionResource{Group: "keyroll.dev", Version: "v1alpha1", Resource: "redisclusters"}
	alphaConnections = schema.GroupVersionResource{Group: "keyroll.dev", Version: "v1alpha1", Resource: "vaultconnections"}
	betaClusters     = schema.GroupVersionResource{Group: "keyroll.dev", Version: "v1beta1", Resource: "redisclusters"}
)

func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(fw.Ground.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// previousSample is a sample of the previous release (v1alpha1), named name in namespace ns.
func previousSample(t *testing.T, file, name, ns string) *unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(previousCRDs(), "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	var u unstructured.Unstructured
	if err := yaml.Unmarshal(raw, &u.Object); err != nil {
		t.Fatal(err)
	}
	u.SetName(name)
	u.SetNamespace(ns)
	return &u
}

// previousStatus is a RedisCluster status as the previous release wrote it: a live lease, its
// token, a superseded lease and a rollout under way.
func previousStatus(conn string) map[string]any {
	return map[string]any{
		"observedGeneration": int64(1), "phase": "Rolling", "readyReplicas": int64(3), "primary": "orders-0",
		"credential": map[string]any{
			"version": "v2hash", "source": "VaultLease", "path": "database/creds/orders", "username": "v-orders-2",
			"leaseID": "database/creds/orders/lease-2", "issuedAt": "2026-12-05T10:00:00Z", "expiresAt": "2026-12-05T11:00:00Z",
			"renewable": true, "leaseDuration": "1h0m0s", "renewalCapped": true, "tokenAccessor": "accessor-2",
			"tokenEndsAt": "2026-12-06T10:00:00Z", "lastRenewal": "2026-12-05T10:40:00Z", "nextRenewal": "2026-12-05T10:50:00Z",
			"lastRotation": "2026-12-05T10:00:00Z", "nextRotation": "2026-12-06T02:00:00Z", "rotationReason": "ScheduledRotation",
			"supersededUsers": []any{"v-orders-0"},
		},
		"leases": []any{
			map[string]any{"leaseID": "database/creds/orders/lease-2", "state": "Active", "version": "v2hash", "username": "v-orders-2",
				"connection": conn, "tokenAccessor": "accessor-2", "issuedAt": "2026-12-05T10:00:00Z", "expiresAt": "2026-12-05T11:00:00Z"},
			map[string]any{"leaseID": "database/creds/orders/lease-1", "state": "Superseded", "version": "v1hash", "username": "v-orders-1",
				"connection": conn, "tokenAccessor": "accessor-1", "issuedAt": "2026-12-04T10:00:00Z", "expiresAt": "2026-12-05T11:30:00Z",
				"lastRenewal": "2026-12-05T10:30:00Z", "supersededBy": "v2hash"},
		},
		"rollout":   map[string]any{"targetVersion": "v2hash", "cause": "Credential", "podsUpdated": int64(1), "podInFlight": "orders-1", "startedAt": "2026-12-05T10:00:05Z"},
		"consumers": []any{map[string]any{"kind": "Deployment", "name": "orders-api", "via": "Listed", "restarted": true}},
	}
}

// TestStoredV1alpha1ReadsAsV1beta1: RedisClusters and a VaultConnection stored as the last
// v1alpha1-only release wrote them, with a status that has every kind of entry (a superseded
// lease, a rollout under way), read as v1beta1 with every value once this release's
// CRDs are applied and the manager serves the conversion webhook; the manager rewrites them at
// v1beta1 and sets storedVersions to [v1beta1]; read as v1alpha1 they are what the previous
// release wrote.
func TestStoredV1alpha1ReadsAsV1beta1(t *testing.T) {
	ctx := context.Background()
	dyn := dynamicClient(t)
	ns := fw.Name("orders")
	ensureNamespace(t, ns)
	ensureNamespace(t, fw.OperatorNS)
	fw.StopOperator()

	// The previous release: its CRDs, a VaultConnection and two RedisClusters with their status.
	installCRDs(t, previousCRDs(), true)
	conn := previousSample(t, "vaultconnection.yaml", fw.Name("vault"), "")
	if err := unstructured.SetNestedField(conn.Object, "vault.internal", "spec", "tls", "tlsServerName"); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(alphaConnections).Create(ctx, conn, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	written := map[string]*unstructured.Unstructured{}
	for _, name := range []string{"orders", "orders-b"} {
		rc := previousSample(t, "rediscluster-vaultlease.yaml", name, ns)
		if err := unstructured.SetNestedField(rc.Object, conn.GetName(), "spec", "credentials", "vaultLease", "connectionRef", "name"); err != nil {
			t.Fatal(err)
		}
		created, err := dyn.Resource(alphaClusters).Namespace(ns).Create(ctx, rc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Object["status"] = previousStatus(conn.GetName())
		withStatus, err := dyn.Resource(alphaClusters).Namespace(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		written[name] = withStatus
	}

	// The upgrade: this release's CRDs, then its manager.
	installCRDs(t, currentCRDs(), false)
	for _, name := range conversion.CRDs {
		if got := storedVersions(t, name); !slices.Equal(got, []string{"v1alpha1", "v1beta1"}) {
			t.Fatalf("%s storedVersions %v right after the upgrade, want [v1alpha1 v1beta1]", name, got)
		}
	}
	if err := fw.StartOperator(framework.OperatorOptions{Conversion: &conversion.Options{}}); err != nil {
		t.Fatal(err)
	}
	defer fw.StopOperator()
	framework.Eventually(t, 2*time.Minute, func() string {
		for _, name := range conversion.CRDs {
			if got := storedVersions(t, name); !slices.Equal(got, []string{"v1beta1"}) {
				return name + " storedVersions " + strings.Join(got, ",")
			}
		}
		return ""
	})

	// Read as v1beta1: every value at its new place.
	var rc v1beta1.RedisCluster
	if err := fw.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orders"}, &rc); err != nil {
		t.Fatal(err)
	}
	c := rc.Status.Credential
	if c == nil || c.Lease.LeaseID != "database/creds/orders/lease-2" || c.Lease.Duration == nil || c.Lease.Duration.Duration != time.Hour ||
		!c.Lease.Renewable || !c.Lease.RenewalCapped || c.Lease.NextRenewal == nil || c.VaultLease.Path != "database/creds/orders" ||
		c.VaultLease.TokenAccessor != "accessor-2" || c.VaultLease.TokenEndsAt == nil || c.Username != "v-orders-2" ||
		!slices.Equal(c.SupersededUsers, []string{"v-orders-0"}) {
		t.Fatalf("v1beta1 status.credential: %+v", c)
	}
	if len(rc.Status.Leases) != 2 || rc.Status.Leases[1].SupersededBy != "v2hash" || rc.Spec.Credentials.VaultLease.Path != "database/creds/orders" ||
		rc.Status.Rollout == nil || rc.Status.Rollout.PodInFlight != "orders-1" {
		t.Fatalf("v1beta1 spec or status lost values: %+v", rc.Status)
	}
	var vc v1beta1.VaultConnection
	if err := fw.Client.Get(ctx, client.ObjectKey{Name: conn.GetName()}, &vc); err != nil {
		t.Fatal(err)
	}
	if vc.Spec.TLS == nil || vc.Spec.TLS.ServerName != "vault.internal" || vc.Spec.RateLimit == nil || vc.Spec.RateLimit.Burst != 40 {
		t.Fatalf("v1beta1 VaultConnection spec: %+v", vc.Spec)
	}

	// Read as v1alpha1: what the previous release wrote, field for field.
	for name, w := range written {
		got, err := dyn.Resource(alphaClusters).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Compared as values: "1m" comes back as "1m0s", an empty struct as {}.
		var gotRC, wantRC v1alpha1.RedisCluster
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &gotRC); err != nil {
			t.Fatal(err)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(w.Object, &wantRC); err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(gotRC.Spec, wantRC.Spec) || !equality.Semantic.DeepEqual(gotRC.Status, wantRC.Status) {
			t.Errorf("%s as v1alpha1 after the upgrade is not what the previous release wrote:\n%s", name,
				diff.Diff(map[string]any{"spec": wantRC.Spec, "status": wantRC.Status}, map[string]any{"spec": gotRC.Spec, "status": gotRC.Status}))
		}
		if _, ok := got.GetAnnotations()[v1alpha1.FieldsAnnotation]; ok {
			t.Errorf("%s carries %s, though v1alpha1 has a place for every field", name, v1alpha1.FieldsAnnotation)
		}
	}

	// The annotation cannot carry a spec field past the schema: the API server validates a
	// v1alpha1 write against v1alpha1's schema, and the value in the annotation would reach
	// v1beta1 unseen. replicas 100 is refused at v1beta1 (at most 15), and so is a v1alpha1 write
	// of a valid replicas with 100 in the annotation.
	over := previousSample(t, "rediscluster-vaultlease.yaml", "too-many", ns)
	over.SetAPIVersion(v1beta1.GroupVersion.String())
	if err := unstructured.SetNestedField(over.Object, int64(100), "spec", "replicas"); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(betaClusters).Namespace(ns).Create(ctx, over, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "spec.replicas") {
		t.Fatalf("a v1beta1 RedisCluster with 100 replicas: %v; want refused, naming spec.replicas", err)
	}
	smuggled := previousSample(t, "rediscluster-vaultlease.yaml", "too-many", ns)
	smuggled.SetAnnotations(map[string]string{v1alpha1.FieldsAnnotation: `{"/spec/replicas":100}`})
	_, err := dyn.Resource(alphaClusters).Namespace(ns).Create(ctx, smuggled, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), v1alpha1.FieldsAnnotation) {
		t.Fatalf("a v1alpha1 RedisCluster with replicas 100 in %s: %v; want refused, naming the annotation", v1alpha1.FieldsAnnotation, err)
	}
	t.Logf("a v1alpha1 write with a spec field in the annotation: %v", err)

	// Stored at v1beta1: with the webhook down, both kinds still list at v1beta1, which an object
	// stored as v1alpha1 would fail (it would need converting).
	fw.StopOperator()
	var clusters v1beta1.RedisClusterList
	if err := fw.Client.List(ctx, &clusters, client.InNamespace(ns)); err != nil {
		t.Fatalf("listing RedisClusters at v1beta1 with the webhook down, after the migration: %v", err)
	}
	var conns v1beta1.VaultConnectionList
	if err := fw.Client.List(ctx, &conns); err != nil {
		t.Fatalf("listing VaultConnections at v1beta1 with the webhook down, after the migration: %v", err)
	}
	if len(clusters.Items) != 2 || len(conns.Items) != 1 {
		t.Fatalf("%d RedisClusters and %d VaultConnections, want 2 and 1", len(clusters.Items), len(conns.Items))
	}
}

// TestWebhookDownKeepsListAndWatch: with the conversion webhook unreachable, RedisClusters are
// created, listed, watched and patched at the storage version (no conversion is needed), and a
// v1alpha1 request fails with a message that names the conversion webhook.
func TestWebhookDownKeepsListAndWatch(t *testing.T) {
	ctx, dyn, ns := onCurrentCRDs(t, "down")
	// The manager points the CRDs at its webhook, then goes away.
	if err := fw.StartOperator(framework.OperatorOptions{Conversion: &conversion.Options{}}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, func() string {
		if fw.Operator().Conversion.Serving() == nil {
			return "no certificate served yet"
		}
		if _, err := dyn.Resource(alphaClusters).Namespace(ns).List(ctx, metav1.ListOptions{}); err != nil {
			return "v1alpha1 list with the webhook up: " + err.Error()
		}
		return ""
	})
	fw.StopOperator()

	rc := previousSample(t, "rediscluster-vaultlease.yaml", "orders", ns)
	rc.SetAPIVersion(v1beta1.GroupVersion.String())
	if _, err := dyn.Resource(betaClusters).Namespace(ns).Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a RedisCluster at v1beta1 with the webhook down: %v", err)
	}
	list, err := dyn.Resource(betaClusters).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("listing at v1beta1 with the webhook down: %v", err)
	}
	w, err := dyn.Resource(betaClusters).Namespace(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatalf("watching at v1beta1 with the webhook down: %v", err)
	}
	defer w.Stop()
	patch := []byte(`{"metadata":{"labels":{"watched":"yes"}}}`)
	if _, err := dyn.Resource(betaClusters).Namespace(ns).Patch(ctx, "orders", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("patching at v1beta1 with the webhook down: %v", err)
	}
	select {
	case ev := <-w.ResultChan():
		if u, ok := ev.Object.(*unstructured.Unstructured); ev.Type != watch.Modified || !ok || u.GetLabels()["watched"] != "yes" {
			t.Fatalf("watch event %s %T", ev.Type, ev.Object)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no watch event at v1beta1 with the webhook down")
	}

	_, err = dyn.Resource(alphaClusters).Namespace(ns).Get(ctx, "orders", metav1.GetOptions{})
	if err == nil {
		t.Fatal("a v1alpha1 read succeeded with the webhook down")
	}
	if !strings.Contains(err.Error(), "conversion webhook") || apierrors.IsNotFound(err) {
		t.Fatalf("the v1alpha1 read failed without naming the conversion webhook: %v", err)
	}
	t.Logf("v1alpha1 read with the webhook down: %v", err)
}
