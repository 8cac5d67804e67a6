package tokens

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// leaseLife is what the watch learned of one lease of a ledger.
type leaseLife struct {
	cluster, accessor string
	firstSeen         time.Time
	// leftLedger is when keyroll took it out of the ledger (revoked it); zero while it is there.
	leftLedger time.Time
	// missingSince is when Vault stopped knowing it while it was still in the ledger.
	missingSince time.Time
}

// ledgerWatch samples, once a second, the ledgers of some RedisClusters against Vault: every
// lease in a ledger exists in Vault (as root sees it), and the credential in each credentials
// Secret authenticates, on the Redis Vault created its user on and on every Redis pod of its
// cluster. It records each lease's life, the credential versions and the reasons they were
// issued for, and the ends of the connection's tokens.
type ledgerWatch struct {
	t          *testing.T
	clusters   []*v1beta1.RedisCluster
	connection string

	mu       sync.Mutex
	leases   map[string]*leaseLife
	versions map[string][]string // per cluster, in order
	// reasons are the status.credential.rotationReason of each credential version.
	reasons   map[string]string
	tokenEnds map[string]time.Time
	failures  []string
	samples   int
}

func watchLedgers(t *testing.T, connection string, clusters ...*v1beta1.RedisCluster) *ledgerWatch {
	return &ledgerWatch{t: t, clusters: clusters, connection: connection, leases: map[string]*leaseLife{},
		versions: map[string][]string{}, reasons: map[string]string{}, tokenEnds: map[string]time.Time{}}
}

// run samples for d; a superseded lease may be missing from Vault for a moment while keyroll's
// revocation of it is written to the ledger, never longer than revokeWindow.
func (w *ledgerWatch) run(d time.Duration) {
	const revokeWindow = 5 * time.Second
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Second) {
		w.sample(revokeWindow)
	}
}

func (w *ledgerWatch) fail(format string, args ...any) {
	w.failures = append(w.failures, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

func (w *ledgerWatch) sample(revokeWindow time.Duration) {
	t := w.t
	now := time.Now()
	vc := fw.GetConnection(t, w.connection)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples++
	for _, tok := range vc.Status.Tokens {
		if tok.EndsAt != nil {
			w.tokenEnds[tok.Accessor] = tok.EndsAt.Time
		}
	}
	for _, rc := range w.clusters {
		cur := fw.Get(t, rc)
		inLedger := map[string]bool{}
		for _, l := range cur.Status.Leases {
			inLedger[l.LeaseID] = true
			life := w.leases[l.LeaseID]
			if life == nil {
				life = &leaseLife{cluster: rc.Name, accessor: l.TokenAccessor, firstSeen: now}
				w.leases[l.LeaseID] = life
			}
			if exists, _ := fw.LeaseExists(l.LeaseID); exists {
				life.missingSince = time.Time{}
				continue
			}
			if life.missingSince.IsZero() {
				life.missingSince = now
			}
			if l.State == v1beta1.LeaseActive || now.Sub(life.missingSince) > revokeWindow {
				w.fail("%s: lease %s (%s) is in the ledger but Vault no longer knows it", rc.Name, l.LeaseID, l.State)
			}
		}
		for id, life := range w.leases {
			if life.cluster == rc.Name && !inLedger[id] && life.leftLedger.IsZero() {
				life.leftLedger = now
			}
		}
		if c := cur.Status.Credential; c != nil {
			if vs := w.versions[rc.Name]; len(vs) == 0 || vs[len(vs)-1] != c.Version {
				w.versions[rc.Name] = append(vs, c.Version)
			}
			w.reasons[c.Version] = c.RotationReason
		}
		user, pass, ok := fw.Credentials(rc)
		problem := credentialProblem(rc, user, pass, ok)
		if problem != "" {
			// A rotation retires the old user right after the Secret changed: only the credential
			// the Secret holds after the check counts.
			if u, p, ok := fw.Credentials(rc); ok && (u != user || p != pass) {
				problem = credentialProblem(rc, u, p, ok)
			}
		}
		if problem != "" {
			w.fail("%s: %s", rc.Name, problem)
		}
	}
}

// credentialProblem says why the credential of rc's credentials Secret does not work ("" when it
// does): on the Redis Vault created its user on, and on every Redis pod of rc.
func credentialProblem(rc *v1beta1.RedisCluster, user, pass string, ok bool) string {
	switch {
	case !ok:
		return "no credentials Secret"
	case !fw.Authenticates(user, pass):
		return fmt.Sprintf("the credential in the credentials Secret (user %q) does not authenticate on Vault's Redis", user)
	}
	if msg := fw.OnEveryPod(rc, user, pass, true); msg != "" {
		return "the credential in the credentials Secret does not work on every Redis pod: " + msg
	}
	return ""
}

// check fails the test with what the watch found wrong.
func (w *ledgerWatch) check() {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.failures) > 0 {
		w.t.Fatalf("%d of %d samples found problems:\n%s", len(w.failures), w.samples, strings.Join(w.failures, "\n"))
	}
}
