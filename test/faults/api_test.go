package faults

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// TestStatusWriteFailsAfterIssue puts a fault proxy between the operator and the API server that
// fails the status write recording a newly issued lease in the ledger: after the API server
// committed it (500, or 504 Timeout), or before (500). Whatever the operator saw, Vault ends up
// holding exactly the ledger's one lease, and the consumers' Secret holds that lease's credential.
func TestStatusWriteFailsAfterIssue(t *testing.T) {
	r := newRow(t, 11, "status write fails (500 / timeout after commit) after issue", "no lease leaked, no second credential in use")
	proxy, err := fw.Ground.CP.StartAPIProxy(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Stop)
	bases := []string{"f-status-500", "f-status-504", "f-status-refused"}
	cases := map[string]testground.APIFault{
		"f-status-500": testground.FailAfterCommit, "f-status-504": testground.TimeoutAfterCommit, "f-status-refused": testground.FailBeforeCommit,
	}
	// By base: each case's namespace and VaultConnection; by namespace: its fault.
	namespaces, conns, faults := map[string]string{}, map[string]string{}, map[string]testground.APIFault{}
	for _, base := range bases {
		ns := fw.Namespace(t, base)
		namespaces[base], faults[ns] = ns, cases[base]
		conns[base] = fw.VaultConnection(t, base, framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke)).Name
	}
	var mu sync.Mutex
	failed := map[string]bool{}
	proxy.SetRule(func(method, path string, body []byte) testground.APIFault {
		for ns, fault := range faults {
			if method == http.MethodPatch && strings.HasSuffix(path, "/namespaces/"+ns+"/redisclusters/orders/status") && bytes.Contains(body, []byte(`"leases"`)) {
				mu.Lock()
				defer mu.Unlock()
				if !failed[ns] {
					failed[ns] = true
					return fault
				}
			}
		}
		return testground.PassThrough
	})
	startOperatorOn(t, "status-1", "", "", proxy.Kubeconfig)
	var measured []string
	for _, base := range bases {
		ns := namespaces[base]
		rc := fw.RedisCluster(t, ns, "orders", conns[base], fw.Path(base))
		waitSettled(t, rc, "", settleTimeout)
		mu.Lock()
		hit := failed[ns]
		mu.Unlock()
		if !hit {
			t.Fatalf("%s: no ledger write went through the fault", ns)
		}
		checkLeases(t, rc, base)
		issued := framework.AuditIssues(t, auditLog, fw.Path(base))
		if issued > 2 {
			t.Errorf("%s: %d leases issued for one cluster and one failed write", ns, issued)
		}
		measured = append(measured, fmt.Sprintf("%s: %d issued, 1 live (the ledger's, in the Secret)", strings.TrimPrefix(base, "f-status-"), issued))
	}
	r.measured = "through a fault proxy in front of the API server: " + strings.Join(measured, "; ")
}
