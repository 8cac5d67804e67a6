package rediscluster

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A pod that names the cluster's StatefulSet as its controller (its UID copied) and is named like
// the ordinal a scale-up brings (orders-3 before the StatefulSet grows to 4) is a node only if the
// StatefulSet made it: its controller-revision-hash label names one of the StatefulSet's
// revisions (in its status, or a ControllerRevision it controls), and it was not created before
// the StatefulSet. Any other is a look-alike, reported once in a Warning event that says why.
func TestAPodWithAForgedOwnerIsNoNodeAfterAScaleUp(t *testing.T) {
	revision := func(name string, owner types.UID) *appsv1.ControllerRevision {
		return &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "orders", UID: owner, Controller: ptr.To(true)}}}}
	}
	cases := map[string]struct {
		label   string
		created time.Duration // after the StatefulSet's creation
		extra   []client.Object
		why     string // "": a node
	}{
		"the revision the StatefulSet's status names": {label: testRevision, created: time.Minute},
		"an earlier revision the StatefulSet controls (OnDelete)": {label: "orders-77f9c5d4", created: time.Minute,
			extra: []client.Object{revision("orders-77f9c5d4", "sts-uid")}},
		"no revision label":                       {created: time.Minute, why: "names no revision"},
		"a revision that does not exist":          {label: "orders-1a2b3c4d", created: time.Minute, why: "names no revision"},
		"a revision another StatefulSet controls": {label: "orders-6b7c8d9f", created: time.Minute, extra: []client.Object{revision("orders-6b7c8d9f", "other-uid")}, why: "names no revision"},
		"created before the StatefulSet":          {label: testRevision, created: -time.Minute, why: "created before the StatefulSet"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := newGround(t, 3, tc.extra...)
			ctx := context.Background()
			sts := &appsv1.StatefulSet{}
			if err := g.k8s.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "orders"}, sts); err != nil {
				t.Fatal(err)
			}
			forged := redisPod(g.rc, "orders-3", 3, sts)
			forged.CreationTimestamp = metav1.NewTime(stsCreated.Add(tc.created))
			if tc.label == "" {
				delete(forged.Labels, appsv1.ControllerRevisionHashLabelKey)
			} else {
				forged.Labels[appsv1.ControllerRevisionHashLabelKey] = tc.label
			}
			if err := g.k8s.Create(ctx, forged); err != nil {
				t.Fatal(err)
			}
			sts.Spec.Replicas = ptr.To(int32(4))
			if err := g.k8s.Update(ctx, sts); err != nil {
				t.Fatal(err)
			}

			m, err := listMembers(ctx, g.k8s, g.rc)
			if err != nil {
				t.Fatal(err)
			}
			isNode := len(m.Pods) == 4 && m.Pods[0].Name == "orders-3"
			if tc.why == "" {
				if !isNode || len(m.LookAlikes) != 0 {
					t.Fatalf("nodes %d, look-alikes %d (%v): want orders-3 a node", len(m.Pods), len(m.LookAlikes), m.Why)
				}
				return
			}
			if isNode || len(m.Pods) != 3 || len(m.LookAlikes) != 1 || !strings.Contains(m.Why["orders-3"], tc.why) {
				t.Fatalf("nodes %d, look-alikes %d (%v): want orders-3 a look-alike, %q", len(m.Pods), len(m.LookAlikes), m.Why, tc.why)
			}
			k := &primaryKeeper{Client: g.k8s}
			for range 2 {
				if _, err := k.For(ctx, g.rc, g.conds, ""); err != nil {
					t.Fatal(err)
				}
			}
			events := g.drainEvents()
			if len(events) != 1 || !strings.Contains(events[0], "LookAlikePod") || !strings.Contains(events[0], "Pod orders-3") ||
				!strings.Contains(events[0], tc.why) {
				t.Errorf("events %q: want one LookAlikePod about orders-3 that says %q", events, tc.why)
			}
		})
	}
}
