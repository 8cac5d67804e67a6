package stoppoint

import "testing"

// KEYROLL_STOP_AT names a point and the namespace it is taken for; a point is armed for that
// namespace only, and nothing is armed without the variable.
func TestParse(t *testing.T) {
	p, ns := parse("mid-rollout@shop")
	if p != MidRollout || ns != "shop" {
		t.Errorf("parse = %q, %q", p, ns)
	}
	at, atNamespace = p, ns
	defer func() { at, atNamespace = "", "" }()
	if !Armed(MidRollout, "shop") || Armed(MidRollout, "other") || Armed(AfterIssue, "shop") {
		t.Error("armed for the wrong point or namespace")
	}
	at, atNamespace = parse("")
	if Armed("", "") {
		t.Error("armed without KEYROLL_STOP_AT")
	}
	Reached(AfterIssue, "shop") // returns: not armed
}
