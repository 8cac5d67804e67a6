package status

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Of is a status time as a time.Time; nil is zero.
func Of(t *metav1.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

// At converts a time for the status, at the second precision the API keeps (so that a reconcile
// that computes the same time again writes nothing); zero is nil.
func At(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	mt := metav1.NewTime(t.Truncate(time.Second))
	return &mt
}

// RequeueAfter turns a time into a RequeueAfter from now, at least a second away; zero is zero.
func RequeueAfter(now, at time.Time) time.Duration {
	if at.IsZero() {
		return 0
	}
	if d := at.Sub(now); d > time.Second {
		return d
	}
	return time.Second
}

// Soonest is the shorter of two requeue delays, a zero being none.
func Soonest(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}
