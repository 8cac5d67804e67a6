package conditions

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Setter sets conditions on an object's status and records an event when a condition's status
// or reason changes: events fire on transitions only.
type Setter struct {
	Obj        client.Object
	Conditions *[]metav1.Condition
	Recorder   events.EventRecorder
}

// Set sets one condition and reports whether its status or reason changed. event, when not empty, is the event reason recorded on a transition;
// warning makes it a Warning event.
func (s Setter) Set(condType string, status metav1.ConditionStatus, reason, message string) bool {
	old := meta.FindStatusCondition(*s.Conditions, condType)
	transition := old == nil || old.Status != status || old.Reason != reason
	meta.SetStatusCondition(s.Conditions, metav1.Condition{
		Type: condType, Status: status, Reason: reason, Message: message,
		ObservedGeneration: s.Obj.GetGeneration(),
	})
	return transition
}

// Event records an event on the object.
func (s Setter) Event(warning bool, reason, action, format string, args ...any) {
	if s.Recorder == nil {
		return
	}
	typ := "Normal"
	if warning {
		typ = "Warning"
	}
	s.Recorder.Eventf(s.Obj, nil, typ, reason, action, format, args...)
}
