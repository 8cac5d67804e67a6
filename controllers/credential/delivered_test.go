package credential

import (
	"context"
	"testing"
	"time"

	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/rotation"
)

// The ledger tells rotation.Decide when the credential was delivered (status.credential.deliveredAt,
// which the RedisCluster reconciler records): on a one-minute schedule, a first credential issued
// eleven seconds before the minute and not delivered at the minute is kept; delivered twenty
// seconds after it, it is rotated at the minute after, not before.
func TestScheduledRotationCountsFromTheDelivery(t *testing.T) {
	h := newSourceHarness(t, 0)
	ctx := context.Background()
	rc := h.get(t)
	rc.Spec.Rotation.Schedule = "* * * * *"
	if err := h.k8s.Update(ctx, rc); err != nil {
		t.Fatal(err)
	}
	minute := epoch.Truncate(time.Minute).Add(time.Minute)
	h.clock.SetTime(minute.Add(-11 * time.Second))
	first := h.credential(t).Status.Credential

	h.clock.SetTime(minute)
	if cur := h.credential(t).Status.Credential; cur.Version != first.Version {
		t.Fatalf("at the minute, not delivered: credential %s (%s), want the first one kept", cur.Version, cur.RotationReason)
	}

	rc = h.get(t)
	rc.Status.Credential.DeliveredAt = status.At(minute.Add(20 * time.Second))
	if err := h.k8s.Status().Update(ctx, rc); err != nil {
		t.Fatal(err)
	}
	h.clock.SetTime(minute.Add(59 * time.Second))
	if cur := h.credential(t).Status.Credential; cur.Version != first.Version {
		t.Fatalf("before the minute after the delivery: credential %s (%s), want the first one kept", cur.Version, cur.RotationReason)
	}
	h.clock.SetTime(minute.Add(time.Minute))
	cur := h.credential(t).Status.Credential
	if cur.Version == first.Version || cur.RotationReason != string(rotation.ReasonScheduledRotation) || cur.DeliveredAt != nil {
		t.Errorf("at the minute after the delivery: credential %s (%s), deliveredAt %v; want a scheduled rotation, not delivered yet",
			cur.Version, cur.RotationReason, cur.DeliveredAt)
	}
}
