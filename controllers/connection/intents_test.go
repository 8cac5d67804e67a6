package connection

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// intentsNS is the install's namespace in these tests.
const intentsNS = "keyroll-system"

func newIntents(objs ...client.Object) (*Intents, client.Client) {
	c := fake.NewClientBuilder().WithObjects(objs...).Build()
	return &Intents{Writer: c, Reader: c, Namespace: intentsNS, Clock: clocktesting.NewFakeClock(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))}, c
}

// Two connections never share an intents ConfigMap: not one named like the other's shortened
// name (its first characters, a dash and 16 hexadecimal digits, which is how an earlier keyroll
// shortened a long name), nor two whose names differ past the readable part. Every name is a
// DNS subdomain of at most 253 characters, and the records of one are not the other's.
func TestIntentsOfTwoConnectionsNeverShareAConfigMap(t *testing.T) {
	long := strings.Repeat("a", 240)
	sum := sha256.Sum256([]byte(long))
	likeLongShortened := long[:253-17-len("keyroll-intents-")] + "-" + hex.EncodeToString(sum[:8])
	pairs := map[string][2]string{
		"a name like another's shortened one":      {long, likeLongShortened},
		"names that differ past the readable part": {strings.Repeat("b", 250) + "x", strings.Repeat("b", 250) + "y"},
		"a short name and a long one":              {"vault", long},
	}
	for name, p := range pairs {
		t.Run(name, func(t *testing.T) {
			for _, conn := range p {
				if n := intentsName(conn); len(n) > 253 || len(validation.IsDNS1123Subdomain(n)) > 0 {
					t.Errorf("intentsName(%q) = %q: not a DNS subdomain of at most 253 characters", conn, n)
				}
			}
			if intentsName(p[0]) == intentsName(p[1]) {
				t.Fatalf("connections %q and %q share ConfigMap %s", p[0], p[1], intentsName(p[0]))
			}
			s, _ := newIntents()
			ctx := context.Background()
			if _, err := s.Record(ctx, p[0], "database/creds/orders", types.NamespacedName{Namespace: "shop", Name: "orders"}); err != nil {
				t.Fatal(err)
			}
			if got, err := s.Open(ctx, p[1]); err != nil || len(got) != 0 {
				t.Errorf("the other connection opens %+v, %v; want none of the first's records", got, err)
			}
			if got, err := s.Open(ctx, p[0]); err != nil || len(got) != 1 {
				t.Errorf("the connection opens %+v, %v; want its record", got, err)
			}
		})
	}
	// Dots and dashes where the readable part is cut are dropped: a label neither ends with one.
	if n := intentsName(strings.Repeat("c", 203) + ".-" + strings.Repeat("d", 40)); strings.Contains(n, "c.") || len(validation.IsDNS1123Subdomain(n)) > 0 {
		t.Errorf("a cut before a dot and a dash gives %q", n)
	}
}

// After an upgrade, the records an earlier keyroll left under the ConfigMap's old name
// (keyroll-intents-<connection>) are read with the new ones, and dropped where they are, but only
// from a ConfigMap labelled as keyroll's whose annotation names the connection: another's, or one
// keyroll did not write, is not read. New records go to the new name.
func TestIntentsLeftUnderTheOldNameAreReadAndDropped(t *testing.T) {
	old := func(labelled bool, connection string) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: intentsNS, Name: "keyroll-intents-vault",
			Annotations: map[string]string{v1beta1.LabelVaultConnection: connection}},
			Data: map[string]string{"100-left": `{"path":"database/creds/orders","cluster":"shop/orders","at":"2026-03-04T05:00:00Z"}`}}
		if labelled {
			cm.Labels = map[string]string{v1beta1.LabelManagedBy: v1beta1.ManagedByValue}
		}
		return cm
	}
	for name, tc := range map[string]struct {
		old  *corev1.ConfigMap
		read bool
	}{
		"keyroll's, of this connection":    {old(true, "vault"), true},
		"not labelled as keyroll's":        {old(false, "vault"), false},
		"keyroll's, of another connection": {old(true, "vault-b"), false},
	} {
		t.Run(name, func(t *testing.T) {
			s, c := newIntents(tc.old)
			ctx := context.Background()
			id, err := s.Record(ctx, "vault", "database/creds/orders", types.NamespacedName{Namespace: "shop", Name: "orders"})
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Open(ctx, "vault")
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, in := range got {
				ids = append(ids, in.ID)
			}
			slices.Sort(ids)
			want := []string{id}
			if tc.read {
				want = []string{id, legacyID + "100-left"}
			}
			if !slices.Equal(ids, want) {
				t.Fatalf("Open: %v, want %v", ids, want)
			}
			if err := s.Drop(ctx, "vault", ids...); err != nil {
				t.Fatal(err)
			}
			oldLeft := 1 // a ConfigMap that is not the connection's keeps what it holds
			if tc.read {
				oldLeft = 0
			}
			for n, want := range map[string]int{intentsName("vault"): 0, "keyroll-intents-vault": oldLeft} {
				cm := &corev1.ConfigMap{}
				if err := c.Get(ctx, types.NamespacedName{Namespace: intentsNS, Name: n}, cm); err != nil {
					t.Fatal(err)
				}
				if len(cm.Data) != want {
					t.Errorf("ConfigMap %s holds %v after the drop, want %d records", n, cm.Data, want)
				}
			}
		})
	}
}
