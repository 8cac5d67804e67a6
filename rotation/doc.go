// Package rotation is keyroll's pure time and policy: it parses rotation schedules, computes when a
// lease is renewed (with a jitter that is deterministic per cluster), and decides what a RedisCluster
// needs next (issue, renew, rotate or nothing) as a pure function of plain Go values.
//
// It has no Kubernetes client, no Vault client and does not import the API types: controllers
// translate the RedisCluster's spec and status into an Input and act on the Decision. Time comes
// from the caller (Input.Now) or from an injected k8s.io/utils/clock clock, never from time.Now.
//
// Nothing here runs on a timer: a Decision says when the cluster needs looking at again
// (Decision.When, the next renewal, lookup or scheduled rotation), and the reconciler asks to be
// called back then (RequeueAfter).
package rotation

// The operator image may ship without /usr/share/zoneinfo (distroless); schedules and maintenance
// windows name IANA zones, so the zone database is embedded where the zones are loaded.
import _ "time/tzdata"
