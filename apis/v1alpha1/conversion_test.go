package v1alpha1

import (
	"math/rand"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	"k8s.io/apimachinery/pkg/api/equality"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	runtimeserializer "k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/diff"
	"sigs.k8s.io/controller-runtime/pkg/conversion"
	"sigs.k8s.io/randfill"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// roundTrips is how many random objects of each kind go through each direction.
const roundTrips = 1000

// apiFuzzer fills objects as apimachinery's round-trip tests do (metadata that the API server would
// accept), with times at the second, as they are written.
func apiFuzzer(seed int64) *randfill.Filler {
	scheme := runtime.NewScheme()
	codecs := runtimeserializer.NewCodecFactory(scheme)
	seconds := func(codecs runtimeserializer.CodecFactory) []any {
		return []any{
			func(t *metav1.Time, c randfill.Continue) {
				*t = metav1.Unix(c.Int63n(4e9), 0)
			},
			func(m *metav1.TypeMeta, c randfill.Continue) { *m = metav1.TypeMeta{} },
		}
	}
	return fuzzer.FuzzerFor(fuzzer.MergeFuzzerFuncs(metafuzzer.Funcs, seconds), rand.NewSource(seed), codecs).NilChance(0.3).NumElements(0, 3)
}

// TestConversionRoundTrip: every field of a v1beta1 object survives v1beta1 → v1alpha1 → v1beta1,
// and every field of a v1alpha1 object survives v1alpha1 → v1beta1 → v1alpha1, on random objects
// that fill every field.
func TestConversionRoundTrip(t *testing.T) {
	kinds := []struct {
		name  string
		hub   func() conversion.Hub
		spoke func() conversion.Convertible
	}{
		{"RedisCluster", func() conversion.Hub { return &v1beta1.RedisCluster{} }, func() conversion.Convertible { return &RedisCluster{} }},
		{"VaultConnection", func() conversion.Hub { return &v1beta1.VaultConnection{} }, func() conversion.Convertible { return &VaultConnection{} }},
	}
	for _, k := range kinds {
		t.Run(k.name+"/from v1beta1", func(t *testing.T) {
			f := apiFuzzer(1)
			for i := range roundTrips {
				in := k.hub()
				f.Fill(in)
				spoke, out := k.spoke(), k.hub()
				if err := spoke.ConvertFrom(in); err != nil {
					t.Fatalf("object %d: to v1alpha1: %v", i, err)
				}
				if err := spoke.ConvertTo(out); err != nil {
					t.Fatalf("object %d: back to v1beta1: %v", i, err)
				}
				if !equality.Semantic.DeepEqual(in, out) {
					t.Fatalf("object %d changed on the way through v1alpha1:\n%s", i, diff.Diff(in, out))
				}
			}
		})
		t.Run(k.name+"/from v1alpha1", func(t *testing.T) {
			f := apiFuzzer(2)
			for i := range roundTrips {
				in := k.spoke()
				f.Fill(in)
				hub, out := k.hub(), k.spoke()
				if err := in.ConvertTo(hub); err != nil {
					t.Fatalf("object %d: to v1beta1: %v", i, err)
				}
				if err := out.ConvertFrom(hub); err != nil {
					t.Fatalf("object %d: back to v1alpha1: %v", i, err)
				}
				if !equality.Semantic.DeepEqual(in, out) {
					t.Fatalf("object %d changed on the way through v1beta1:\n%s", i, diff.Diff(in, out))
				}
			}
		})
	}
}

// TestMovedFieldsLandWhereTheOtherVersionHasThem: a v1alpha1 status written by the previous release
// reads in v1beta1 with each value at its new place.
func TestMovedFieldsLandWhereTheOtherVersionHasThem(t *testing.T) {
	at := metav1.Unix(1_800_000_000, 0)
	tracked := true
	in := &RedisCluster{Status: RedisClusterStatus{Credential: &CredentialStatus{
		Version: "v2", Username: "u2", Path: "database/creds/orders", LeaseID: "database/creds/orders/abc",
		ExpiresAt: &at, Renewable: true, LeaseDuration: &metav1.Duration{Duration: 3600e9}, TokenAccessor: "acc",
		LeasesTracked: &tracked, CutOff: true, SupersededUsers: []string{"u1"},
	}}}
	in.Name = "orders"
	var out v1beta1.RedisCluster
	if err := in.ConvertTo(&out); err != nil {
		t.Fatal(err)
	}
	c := out.Status.Credential
	if c.Lease.LeaseID != "database/creds/orders/abc" || !c.Lease.ExpiresAt.Equal(&at) || !c.Lease.Renewable || c.Lease.Duration.Duration != 3600e9 ||
		c.VaultLease.Path != "database/creds/orders" || c.VaultLease.TokenAccessor != "acc" ||
		c.ExternalSecret.LeasesTracked == nil || !*c.ExternalSecret.LeasesTracked || !c.ExternalSecret.CutOff ||
		len(c.SupersededUsers) != 1 || c.Username != "u2" || out.Name != "orders" {
		t.Fatalf("v1beta1 credential status: %+v", c)
	}

	vc := &VaultConnection{Spec: VaultConnectionSpec{Address: "https://vault:8200", TLS: &VaultTLS{TLSServerName: "vault.internal"}}}
	var vcOut v1beta1.VaultConnection
	if err := vc.ConvertTo(&vcOut); err != nil {
		t.Fatal(err)
	}
	if vcOut.Spec.TLS == nil || vcOut.Spec.TLS.ServerName != "vault.internal" {
		t.Fatalf("v1beta1 tls: %+v", vcOut.Spec.TLS)
	}
}

// TestFieldsWithoutCounterpartAreKeptInTheAnnotation: a v1beta1 spec field that v1alpha1 has no
// place for travels in the annotation and is back in place after the return; the annotation never
// reaches v1beta1. A status field without a place is left out instead (conversion.go says why).
// (No such field exists between these two versions, so the test moves fields to paths v1alpha1
// lacks.)
func TestFieldsWithoutCounterpartAreKeptInTheAnnotation(t *testing.T) {
	moves := []move{{"/spec/nowhere/replicas", "/spec/replicas"}, {"/status/nowhere/phase", "/status/phase"}}
	in := &v1beta1.RedisCluster{Spec: v1beta1.RedisClusterSpec{Replicas: 3, Image: "redis"},
		Status: v1beta1.RedisClusterStatus{Phase: v1beta1.PhaseRolling, Primary: "orders-0"}}
	in.Annotations = map[string]string{"team": "payments"}
	var spoke RedisCluster
	if err := fromHub(in, &spoke, moves); err != nil {
		t.Fatal(err)
	}
	if spoke.Spec.Replicas != 0 || spoke.Annotations[FieldsAnnotation] != `{"/spec/nowhere":{"replicas":3}}` ||
		spoke.Status.Phase != "" || spoke.Status.Primary != "orders-0" || spoke.Spec.Image != "redis" {
		t.Fatalf("v1alpha1: replicas %d, phase %q, annotations %v", spoke.Spec.Replicas, spoke.Status.Phase, spoke.Annotations)
	}
	var out v1beta1.RedisCluster
	if err := toHub(&spoke, &out, moves); err != nil {
		t.Fatal(err)
	}
	want := in.DeepCopy()
	want.Status.Phase = "" // left out of v1alpha1
	if !equality.Semantic.DeepEqual(want, &out) {
		t.Fatalf("back in v1beta1:\n%s", diff.Diff(want, &out))
	}

	// A field v1beta1 has no place for is refused, never dropped.
	bad := &RedisCluster{}
	bad.Annotations = map[string]string{FieldsAnnotation: `{"/spec/unheardOf":1}`}
	if err := toHub(bad, &out, nil); err == nil {
		t.Fatal("a field v1beta1 lacks was accepted")
	}
	bad.Annotations = map[string]string{FieldsAnnotation: `{"/metadata/name":"x"}`}
	if err := toHub(bad, &out, nil); err == nil {
		t.Fatal("the annotation was allowed to set metadata")
	}
	// A field v1alpha1 has is refused too: the annotation would override the value v1alpha1's
	// schema and CEL rules validated with one that no schema has seen.
	for _, f := range []string{`{"/spec/replicas":1000}`, `{"/spec/credentials/vaultLease/path":"database/creds/other-team"}`,
		`{"/spec/credentials":{"source":"VaultLease"}}`} {
		bad := &RedisCluster{Spec: RedisClusterSpec{Replicas: 3}}
		bad.Annotations = map[string]string{FieldsAnnotation: f}
		if err := toHub(bad, &out, redisClusterMoves); err == nil || !strings.Contains(err.Error(), "is a field of keyroll.dev/v1alpha1") {
			t.Errorf("annotation %s: %v; want it refused as a field of v1alpha1", f, err)
		}
	}
	// So is a field v1alpha1 has at another path (spec.tls.tlsServerName is v1beta1's
	// spec.tls.serverName), and a part of one.
	for _, f := range []string{`{"/spec/tls":{"tlsServerName":"vault.evil"}}`, `{"/spec/tls/serverName":"vault.evil"}`} {
		vc := &VaultConnection{}
		vc.Annotations = map[string]string{FieldsAnnotation: f}
		var vcOut v1beta1.VaultConnection
		if err := toHub(vc, &vcOut, vaultConnectionMoves); err == nil {
			t.Errorf("annotation %s was allowed to set a VaultConnection's spec.tls: %+v", f, vcOut.Spec.TLS)
		}
	}
}

// TestAWriteOfTheObjectSetsNoStatusThroughTheAnnotation: the API server answers an update of a
// v1alpha1 RedisCluster (the main resource, not status) by putting back the status the stored
// object had, read through v1alpha1, and converting the result to v1beta1: the writer's
// annotations go through as written. None of them sets a status field (one v1alpha1 lacks, the
// lease or the external-secret part of the credential, or a credential where there is none): the
// write is refused, and the stored status is never the annotation's. A write of the status
// subresource starts from the stored object's metadata, annotations included, and keeps the
// status v1alpha1 does not show.
func TestAWriteOfTheObjectSetsNoStatusThroughTheAnnotation(t *testing.T) {
	at := metav1.Unix(1_800_000_000, 0)
	stored := &v1beta1.RedisCluster{Spec: v1beta1.RedisClusterSpec{Replicas: 3}}
	stored.Name, stored.Namespace = "orders", "shop"
	stored.Status.Primary = "orders-0"
	withCredential := stored.DeepCopy()
	withCredential.Status.Credential = &v1beta1.CredentialStatus{Version: "v2", Username: "u2",
		Lease: v1beta1.CredentialLease{LeaseID: "database/creds/orders/abc", ExpiresAt: &at}}
	for name, tc := range map[string]struct {
		stored     *v1beta1.RedisCluster
		annotation string
	}{
		"a credential where there is none":         {stored, `{"/status/credential/lease":{"leaseID":"database/creds/other/x"}}`},
		"a lease field the stored status lacks":    {withCredential, `{"/status/credential/lease/nextRenewal":"2020-01-01T00:00:00Z"}`},
		"the lease, whole":                         {withCredential, `{"/status/credential/lease":{"leaseID":"database/creds/other/x"}}`},
		"the external-secret part of a credential": {withCredential, `{"/status/credential/externalSecret":{"cutOff":true}}`},
	} {
		t.Run(name, func(t *testing.T) {
			var old RedisCluster
			if err := old.ConvertFrom(tc.stored); err != nil {
				t.Fatal(err)
			}
			// The writer's object: its spec and annotations, and the status put back from the old.
			written := old.DeepCopy()
			written.Spec.Replicas = 5
			written.Annotations = map[string]string{FieldsAnnotation: tc.annotation}
			var out v1beta1.RedisCluster
			err := written.ConvertTo(&out)
			if err == nil {
				t.Fatalf("stored status %+v, credential %+v: want the write refused", out.Status, out.Status.Credential)
			}
			if !strings.Contains(err.Error(), "not a field of spec") {
				t.Errorf("refused with %v: want it to say the annotation sets no status", err)
			}
		})
	}

	// A status write keeps the stored object's metadata: the lease's fields come back whole.
	var old RedisCluster
	if err := old.ConvertFrom(withCredential); err != nil {
		t.Fatal(err)
	}
	written := old.DeepCopy()
	written.Status.Primary = "orders-1"
	var out v1beta1.RedisCluster
	if err := written.ConvertTo(&out); err != nil {
		t.Fatal(err)
	}
	if out.Status.Primary != "orders-1" || !equality.Semantic.DeepEqual(out.Status.Credential, withCredential.Status.Credential) {
		t.Errorf("after a status write: primary %s, credential %+v", out.Status.Primary, out.Status.Credential)
	}
}

// TestNoSpecFieldNeedsTheAnnotation: no v1beta1 spec field lacks a place in v1alpha1, so no v1beta1
// object's spec travels in FieldsAnnotation. A spec field that did could be set through a v1alpha1
// write without v1beta1's schema and CEL rules ever seeing its value (the API server validates a
// write at the version it was made in): this test fails when one is added, so that it comes with
// a check of its own in the conversion, or v1alpha1 is no longer served.
func TestNoSpecFieldNeedsTheAnnotation(t *testing.T) {
	f := apiFuzzer(3)
	for i := range roundTrips {
		for _, in := range []conversion.Hub{&v1beta1.RedisCluster{}, &v1beta1.VaultConnection{}} {
			f.Fill(in)
			var spoke conversion.Convertible = &RedisCluster{}
			if _, ok := in.(*v1beta1.VaultConnection); ok {
				spoke = &VaultConnection{}
			}
			if err := spoke.ConvertFrom(in); err != nil {
				t.Fatalf("object %d: %v", i, err)
			}
			if kept := spoke.(interface{ GetAnnotations() map[string]string }).GetAnnotations()[FieldsAnnotation]; strings.Contains(kept, `"/spec`) {
				t.Fatalf("object %d: v1beta1 spec fields without a place in v1alpha1: %s", i, kept)
			}
		}
	}
}
