package rediscluster

import (
	"context"
	"maps"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/render"
)

// The cluster owns a PodDisruptionBudget for its Redis pods, labelled as keyroll's (the
// manager's cache sees only those), selecting the StatefulSet's pods.
func TestClusterOwnsABudgetForItsRedisPods(t *testing.T) {
	h := newHarness(t, cluster())
	rc := h.settle(t)
	pdb := &policyv1.PodDisruptionBudget{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-redis"}, pdb); err != nil {
		t.Fatal(err)
	}
	if !apply.OwnedBy(pdb, rc) {
		t.Errorf("the PodDisruptionBudget is not controlled by the RedisCluster: %+v", pdb.OwnerReferences)
	}
	if pdb.Labels[v1beta1.LabelManagedBy] != v1beta1.ManagedByValue || pdb.Labels[v1beta1.LabelCluster] != "orders" {
		t.Errorf("labels %v: the manager's cache would not see it", pdb.Labels)
	}
	sts := &appsv1.StatefulSet{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, sts); err != nil {
		t.Fatal(err)
	}
	if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.IntValue() != 1 || !maps.Equal(pdb.Spec.Selector.MatchLabels, sts.Spec.Selector.MatchLabels) {
		t.Errorf("budget spec %+v, StatefulSet selector %v", pdb.Spec, sts.Spec.Selector.MatchLabels)
	}
}

// A PodDisruptionBudget of keyroll's name that someone else made (before keyroll made one) is
// left as it is and reported in Ready; the cluster's Redis objects and credential go on.
func TestABudgetOfKeyrollsNameThatIsNotKeyrollsIsLeftAlone(t *testing.T) {
	theirs := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: render.PodDisruptionBudgetName(cluster())},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "theirs"}}},
	}
	h := newHarness(t, cluster(), theirs)
	rc := h.settle(t)

	got := &policyv1.PodDisruptionBudget{}
	if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(theirs), got); err != nil {
		t.Fatal(err)
	}
	if len(got.OwnerReferences) != 0 || got.Spec.MaxUnavailable != nil || got.Spec.Selector.MatchLabels["app"] != "theirs" {
		t.Errorf("keyroll changed a PodDisruptionBudget that is not its own: %+v %+v", got.OwnerReferences, got.Spec)
	}
	c := condition(rc, v1beta1.ConditionReady)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1beta1.ReasonSecretConflict ||
		!strings.Contains(c.Message, "PodDisruptionBudget orders-redis exists") || strings.Contains(c.Message, "secretName") {
		t.Errorf("Ready %+v: want False, naming the PodDisruptionBudget (and no Secret hint)", c)
	}
	if cr := condition(rc, v1beta1.ConditionCredentialsReady); cr == nil || cr.Status != metav1.ConditionTrue || rc.Status.Credential == nil {
		t.Errorf("CredentialsReady %+v: the credential must not wait for the budget", cr)
	}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &appsv1.StatefulSet{}); err != nil {
		t.Errorf("no StatefulSet: %v", err)
	}
}
