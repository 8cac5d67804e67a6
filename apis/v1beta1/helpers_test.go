package v1beta1

import (
	"strings"
	"testing"
)

// An annotation of any size is acknowledged within status's bound, and two long values that differ
// are told apart.
func TestAcknowledgementStaysWithinItsBound(t *testing.T) {
	short := strings.Repeat("a", MaxAcknowledgement)
	if got := Acknowledgement(short); got != short {
		t.Errorf("a value of %d characters is recorded as %q, want itself", len(short), got)
	}
	long, other := strings.Repeat("a", 256<<10), strings.Repeat("a", 256<<10-1)+"b"
	a, b := Acknowledgement(long), Acknowledgement(other)
	if len(a) > MaxAcknowledgement || !strings.HasPrefix(a, "sha256:") || a == b {
		t.Errorf("values of 256 KiB recorded as %q and %q: want distinct digests within %d characters", a, b, MaxAcknowledgement)
	}
	rc := &RedisCluster{}
	rc.Annotations = map[string]string{AnnotationRotateNow: long}
	if !rc.RotationAsked() {
		t.Error("a long rotate-now request is not asked")
	}
	rc.Status.RotateNowAcknowledged = a
	if rc.RotationAsked() {
		t.Error("a long rotate-now request acknowledged by its digest is asked again")
	}
}
