// Package stoppoint stops the operator at a named step, so that the fault tests can kill it
// (SIGKILL) exactly there and show that a restart loses nothing. The step is named by the
// environment variable KEYROLL_STOP_AT, which only those tests set, as point@namespace: the
// point is taken for a RedisCluster of that namespace only. Without it every point is a no-op.
package stoppoint

import (
	"fmt"
	"os"
	"strings"
)

// Point names a step boundary.
type Point string

// The boundaries a test can stop the operator at.
const (
	// AfterIssue: Vault issued a lease; no ledger holds it yet.
	AfterIssue Point = "after-issue"
	// AfterLedgerWrite: the new lease is in the ledger; no node or consumer has the credential.
	AfterLedgerWrite Point = "after-ledger-write"
	// AfterSecretWrite: the consumers' Secret holds a rotation's new credential; its rollout has
	// not started (no consumer restarted, nothing of it in status).
	AfterSecretWrite Point = "after-secret-write"
	// MidRollout: a Redis pod or a consumer was restarted for a rollout; the rollout is not done.
	MidRollout Point = "mid-rollout"
	// BeforeRevoke: a lease is about to be revoked.
	BeforeRevoke Point = "before-revoke"
	// AfterRevoke: Vault revoked a lease; the ledger still holds it.
	AfterRevoke Point = "after-revoke"
)

// Env is the environment variable that names the point to stop at.
const Env = "KEYROLL_STOP_AT"

// Marker starts the line printed on standard error when a point is reached.
const Marker = "KEYROLL STOP POINT "

var at, atNamespace = parse(os.Getenv(Env))

func parse(v string) (Point, string) {
	p, ns, _ := strings.Cut(v, "@")
	return Point(p), ns
}

// Armed says whether the process stops at p for a RedisCluster in namespace.
func Armed(p Point, namespace string) bool {
	return at != "" && at == p && namespace == atNamespace
}

// Reached stops the calling goroutine for good at p, for a RedisCluster in namespace, when that is
// the point named by Env, after printing Marker and p on standard error; the test waits for that
// line and kills the process. Other goroutines go on, as they would until a real kill. Elsewhere
// it returns at once.
func Reached(p Point, namespace string) {
	if !Armed(p, namespace) {
		return
	}
	fmt.Fprintf(os.Stderr, "%s%s\n", Marker, p)
	select {}
}
