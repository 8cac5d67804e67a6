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

// TestFieldsWithoutCounterpartAreKeptInTheAnnotation: a v1beta1 field that v1alpha1 has no place
// for travels in the annotation and is back in place after the return; the annotation never
// reaches v1beta1. (No such field exists yet between these two versions, so the test moves a
// status field to a path v1alpha1 lacks.)
func TestFieldsWithoutCounterpartAreKeptInTheAnnotation(t *testing.T) {
	moves := []move{{"/status/nowhere/phase", "/status/phase"}}
	in := &v1beta1.RedisCluster{Status: v1beta1.RedisClusterStatus{Phase: v1beta1.PhaseRolling, Primary: "orders-0"}}
	in.Annotations = map[string]string{"team": "payments"}
	var spoke RedisCluster
	if err := fromHub(in, &spoke, moves); err != nil {
		t.Fatal(err)
	}
	if spoke.Status.Phase != "" || spoke.Annotations[FieldsAnnotation] != `{"/status/nowhere":{"phase":"Rolling"}}` || spoke.Status.Primary != "orders-0" {
		t.Fatalf("v1alpha1: phase %q, annotations %v", spoke.Status.Phase, spoke.Annotations)
	}
	var out v1beta1.RedisCluster
	if err := toHub(&spoke, &out, moves); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(in, &out) {
		t.Fatalf("back in v1beta1:\n%s", diff.Diff(in, &out))
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
		`{"/spec/credentials":{"source":"VaultLease"}}`, `{"/status/phase":"Ready"}`} {
		bad := &RedisCluster{Spec: RedisClusterSpec{Replicas: 3}}
		bad.Annotations = map[string]string{FieldsAnnotation: f}
		if err := toHub(bad, &out, redisClusterMoves); err == nil || !strings.Contains(err.Error(), "is a field of keyroll.dev/v1alpha1") {
			t.Errorf("annotation %s: %v; want it refused as a field of v1alpha1", f, err)
		}
	}
	vc := &VaultConnection{}
	vc.Annotations = map[string]string{FieldsAnnotation: `{"/spec/tls":{"tlsServerName":"vault.evil"}}`}
	if err := toHub(vc, &v1beta1.VaultConnection{}, vaultConnectionMoves); err == nil {
		t.Error("the annotation was allowed to set a VaultConnection's spec.tls")
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
