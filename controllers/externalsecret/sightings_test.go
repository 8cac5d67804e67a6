package externalsecret

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestSightingsAreKeptUntilForgotten(t *testing.T) {
	var s sightings
	a, b := types.NamespacedName{Namespace: "n", Name: "a"}, types.NamespacedName{Namespace: "n", Name: "b"}
	s.record(a, "l2")
	s.record(a, "l1")
	s.record(a, "l1")
	s.record(b, "l3")
	if got := s.peek(a); strings.Join(got, ",") != "l1,l2" {
		t.Fatalf("peek %v", got)
	}
	s.forget(a, []string{"l1"})
	if got := s.peek(a); strings.Join(got, ",") != "l2" {
		t.Fatalf("after forgetting l1: %v", got)
	}
	s.forget(b, nil)
	if got := s.peek(b); len(got) != 0 {
		t.Fatalf("after forgetting all of b: %v", got)
	}
}
