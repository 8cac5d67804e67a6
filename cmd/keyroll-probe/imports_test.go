package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsRedisnodeAndNoKubernetes: the sidecar, which runs in every Redis pod, depends on
// keyroll's Redis client alone and on nothing of Kubernetes, so that it stays small in memory.
func TestImportsRedisnodeAndNoKubernetes(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/keyroll/keyroll/"
	for _, p := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(p, "k8s.io/") || strings.HasPrefix(p, "sigs.k8s.io/"):
			t.Errorf("keyroll-probe depends on %s; it needs nothing of Kubernetes", p)
		case strings.HasPrefix(p, module) && p != module+"cmd/keyroll-probe" && p != module+"redisnode":
			t.Errorf("keyroll-probe depends on %s; it may use redisnode only", p)
		}
	}
}
