package status

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Setter sets conditions on an object's status and records an event when a condition's status
// or reason changes: events fire on transitions only.
type Setter struct {
	Obj        client.Object
	Conditions *[]metav1.Condition
	Recorder   events.EventRecorder
	// Announced holds the events of Announce until the status that carries their change is
	// written (nil: Announce records at once).
	Announced *Announced
}

// Set sets one condition and reports whether its status or reason changed; the caller announces
// the change (Announce) when it is one people should hear of.
func (s Setter) Set(condType string, status metav1.ConditionStatus, reason, message string) bool {
	old := meta.FindStatusCondition(*s.Conditions, condType)
	transition := old == nil || old.Status != status || old.Reason != reason
	meta.SetStatusCondition(s.Conditions, metav1.Condition{
		Type: condType, Status: status, Reason: reason, Message: message,
		ObservedGeneration: s.Obj.GetGeneration(),
	})
	return transition
}

// Event records an event on the object at once: for what was done outside the object's status
// (a lease issued or revoked, a pod restarted), which happened whether or not the status is
// written afterwards.
func (s Setter) Event(warning bool, reason, action, format string, args ...any) {
	if s.Recorder == nil {
		return
	}
	s.Recorder.Eventf(s.Obj, nil, eventType(warning), reason, action, format, args...)
}

// EventAbout records an event on the object at once that concerns related too (a pod of the
// object's, say): events about different related objects are not folded into one series.
func (s Setter) EventAbout(related runtime.Object, warning bool, reason, action, format string, args ...any) {
	if s.Recorder != nil {
		s.Recorder.Eventf(s.Obj, related, eventType(warning), reason, action, format, args...)
	}
}

// Announce records an event about a change of the object's status (a condition's transition,
// a step recorded there) once that status is written. If the write fails, the event is dropped
// with it: the next reconcile, starting from the status as it was, finds the same change and
// announces it then, so that a change is announced once however many reconciles compute it.
func (s Setter) Announce(warning bool, reason, action, format string, args ...any) {
	if s.Announced == nil {
		s.Event(warning, reason, action, format, args...)
		return
	}
	s.Announced.queued = append(s.Announced.queued, announcement{
		warning: warning, reason: reason, action: action, note: fmt.Sprintf(format, args...)})
}

// Written records the announced events: the status that carries their changes was written.
func (s Setter) Written() {
	if s.Announced == nil {
		return
	}
	for _, a := range s.Announced.queued {
		s.Event(a.warning, a.reason, a.action, "%s", a.note)
	}
	s.Announced.queued = nil
}

// NotWritten drops the announced events: the status that carried their changes was not written.
func (s Setter) NotWritten() {
	if s.Announced != nil {
		s.Announced.queued = nil
	}
}

// Announced is the queue of events waiting for their status write.
type Announced struct {
	queued []announcement
}

type announcement struct {
	warning              bool
	reason, action, note string
}

func eventType(warning bool) string {
	if warning {
		return "Warning"
	}
	return "Normal"
}
