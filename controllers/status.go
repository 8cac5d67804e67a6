package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// conditionSetter sets conditions on an object's status and records an event when a condition's
// status or reason changes: events fire on transitions only.
type conditionSetter struct {
	obj        client.Object
	conditions *[]metav1.Condition
	recorder   events.EventRecorder
}

// set sets one condition. event, when not empty, is the event reason recorded on a transition;
// warning makes it a Warning event.
func (s conditionSetter) set(condType string, status metav1.ConditionStatus, reason, message string) bool {
	old := meta.FindStatusCondition(*s.conditions, condType)
	transition := old == nil || old.Status != status || old.Reason != reason
	meta.SetStatusCondition(s.conditions, metav1.Condition{
		Type: condType, Status: status, Reason: reason, Message: message,
		ObservedGeneration: s.obj.GetGeneration(),
	})
	return transition
}

// event records an event on the object.
func (s conditionSetter) event(warning bool, reason, action, format string, args ...any) {
	if s.recorder == nil {
		return
	}
	typ := "Normal"
	if warning {
		typ = "Warning"
	}
	s.recorder.Eventf(s.obj, nil, typ, reason, action, format, args...)
}

// patchStatus writes the status once, as a merge patch with optimistic locking (a stale cache
// must never overwrite the lease ledger), and only when it changed.
func patchStatus(ctx context.Context, c client.Client, before, after client.Object, statusOf func(client.Object) any) error {
	if equality.Semantic.DeepEqual(statusOf(before), statusOf(after)) {
		return nil
	}
	if err := c.Status().Patch(ctx, after, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patching status: %w", err)
	}
	return nil
}
