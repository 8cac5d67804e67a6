package apply

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestCacheKeepsOnlyKeyrollsAppliedFields(t *testing.T) {
	own := metav1.ManagedFieldsEntry{Manager: FieldOwner, Operation: metav1.ManagedFieldsOperationApply, FieldsType: "FieldsV1"}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "orders", ManagedFields: []metav1.ManagedFieldsEntry{
		{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"},
		own,
		{Manager: FieldOwner, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"},
		{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate},
	}}}
	out, err := KeepOwnManagedFields(sts)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.(*appsv1.StatefulSet).ManagedFields; len(got) != 1 || got[0].Manager != own.Manager || got[0].Operation != own.Operation {
		t.Errorf("kept %+v; want keyroll's apply entry only", got)
	}

	meta := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "shop", ManagedFields: []metav1.ManagedFieldsEntry{
		{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply},
	}}}
	if out, _ := KeepOwnManagedFields(meta); len(out.(*metav1.PartialObjectMetadata).ManagedFields) != 0 {
		t.Error("a consumer workload's metadata kept its managedFields")
	}
	if out, err := KeepOwnManagedFields("not an object"); err != nil || out != "not an object" {
		t.Errorf("a value that is no object: %v, %v", out, err)
	}
}
