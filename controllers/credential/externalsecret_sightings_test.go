package credential

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestSightingsAreKeptUntilForgotten(t *testing.T) {
	var s sightings
	a, b := types.NamespacedName{Namespace: "n", Name: "a"}, types.NamespacedName{Namespace: "n", Name: "b"}
	s.record(a, "l2", "es-a")
	s.record(a, "l1", "es-a")
	s.record(a, "l1", "es-a")
	s.record(b, "l3", "es-b")
	if got := s.peek(a, "es-a"); strings.Join(got, ",") != "l1,l2" {
		t.Fatalf("peek %v", got)
	}
	s.forget(a, []string{"l1"})
	if got := s.peek(a, "es-a"); strings.Join(got, ",") != "l2" {
		t.Fatalf("after forgetting l1: %v", got)
	}
	s.forget(b, nil)
	if got := s.peek(b, "es-b"); len(got) != 0 {
		t.Fatalf("after forgetting all of b: %v", got)
	}
}

// A lease seen in a Secret that another ExternalSecret controls (or a look-alike one a tenant
// wrote, naming an ExternalSecret of the same name) is never handed out for keyroll's own.
func TestSightingsOfAnotherExternalSecretAreNotTaken(t *testing.T) {
	var s sightings
	a := types.NamespacedName{Namespace: "n", Name: "a"}
	s.record(a, "ours", "es-uid")
	s.record(a, "forged", "other-uid")
	if got := s.peek(a, "es-uid"); strings.Join(got, ",") != "ours" {
		t.Fatalf("peek for keyroll's ExternalSecret: %v", got)
	}
	if got := s.peek(a, ""); len(got) != 0 {
		t.Fatalf("peek without an ExternalSecret: %v", got)
	}
}
