package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsOnlyTheAPI: the plugin depends on keyroll's API types and nothing else of keyroll's
// (not the controllers, not the Vault client), so it stays a small client of the API server.
func TestImportsOnlyTheAPI(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/keyroll/keyroll/"
	seen := 0
	for _, p := range strings.Fields(string(out)) {
		if !strings.HasPrefix(p, module) || p == module+"cmd/kubectl-keyroll" {
			continue
		}
		seen++
		if p != module+"apis/v1beta1" {
			t.Errorf("kubectl-keyroll depends on %s; it may use apis/v1beta1 only", p)
		}
	}
	if seen != 1 {
		t.Errorf("kubectl-keyroll depends on %d packages of keyroll's, want apis/v1beta1 alone", seen)
	}
}
