package isolation

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// The clusters of TestFailingClustersDoNotDelayOthers, as the issue sets them.
const healthyN, hangingN, refusedN = 20, 20, 500

// window and faultWindow are how long the healthy clusters' upkeep is watched, before and from the
// faulty clusters' creation on; each window has one rotation of every healthy cluster, rotateAt
// into it.
const window, faultWindow, rotateAt = 100 * time.Second, 150 * time.Second, 30 * time.Second

// maxWait is the README's promise: no retry, and no upkeep that is due, waits more than 30 s.
const maxWait = 30 * time.Second

// The markers between which docs/reliability.md holds this test's figures.
const (
	sectionBegin = "<!-- isolation:begin (written by make reliability) -->"
	sectionEnd   = "<!-- isolation:end -->"
)

// TestFailingClustersDoNotDelayOthers: 500 clusters whose Vault path is refused (every retry a
// Vault call and a status write) and 20 whose Redis accepts and never answers (every look a
// wait on Redis) do not delay 20 healthy clusters: their renewals come when planned and a rotation
// takes about as long as without the faults. Each renewal's wait (from when it was planned to when
// it was done) stays under 30 s, and every healthy cluster renews throughout.
func TestFailingClustersDoNotDelayOthers(t *testing.T) {
	ns := fw.Namespace(t, "iso")
	vc := fw.VaultConnection(t, "vault", framework.Allow(ns))
	serveRedisNodes(t, ns)
	var healthy []*v1beta1.RedisCluster
	for i := range healthyN {
		healthy = append(healthy, fw.RedisCluster(t, ns, fmt.Sprintf("%s%02d", healthyPrefix, i), vc.Name, fw.Path("healthy")))
	}
	start := time.Now()
	for _, rc := range healthy {
		fw.WaitReady(t, rc, 5*time.Minute)
	}
	t.Logf("%d healthy clusters Ready %s after they were created", healthyN, time.Since(start).Round(time.Second))

	before := watchUpkeep(t, ns, window)
	before.name = fmt.Sprintf("%d healthy clusters alone", healthyN)

	// The healthy clusters are watched from the moment the faulty ones are created: the operator
	// takes them all in at once then, the busiest time.
	faultsAt := time.Now()
	watched := make(chan upkeep)
	go func() { watched <- watchUpkeep(t, ns, faultWindow) }()
	createMany(t, ns, hangingPrefix, hangingN, vc.Name, fw.Path("hanging"))
	createMany(t, ns, refusedPrefix, refusedN, vc.Name, fw.Path("missing")) // no such role: Vault refuses
	hanging, refused := faultsReported(t, ns, 4*time.Minute)
	t.Logf("faults reported %s after they were created: %d of %d hanging clusters NodeUnreachable, %d of %d refused clusters with Vault's refusal",
		time.Since(faultsAt).Round(time.Second), hanging, hangingN, refused, refusedN)
	during := <-watched
	during.name = fmt.Sprintf("beside %d refused and %d hanging, from their creation on", refusedN, hangingN)
	settled := watchUpkeep(t, ns, window)
	settled.name = "beside them, once every one has reported its fault"

	table := "| | renewals | renewal wait: median | 95th percentile | longest | rotation of all 20: median | longest |\n|---|---|---|---|---|---|---|\n" +
		before.row() + during.row() + settled.row()
	t.Logf("\n%s", table)
	if hanging < hangingN || refused < refusedN {
		t.Errorf("not every faulty cluster reported its fault (%d hanging, %d refused): the faults were not all in place", hanging, refused)
	}
	for _, u := range []upkeep{before, during, settled} {
		if u.longest() > maxWait {
			t.Errorf("%s: a renewal waited %s after it was due, more than %s", u.name, u.longest().Round(time.Millisecond), maxWait)
		}
		for _, rc := range healthy {
			if u.renewed[rc.Name] < 2 {
				t.Errorf("%s: cluster %s renewed %d times in %s of 30 s leases, want at least 2", u.name, rc.Name, u.renewed[rc.Name], u.window)
			}
		}
		if len(u.rotations) < healthyN {
			t.Errorf("%s: %d of %d healthy clusters rotated within the window", u.name, len(u.rotations), healthyN)
		}
	}
	for _, u := range []upkeep{during, settled} {
		if b, d := slowest(before.rotations), slowest(u.rotations); d > b+maxWait {
			t.Errorf("%s: the slowest rotation took %s, %s without the faulty clusters", u.name, d, b)
		}
	}
	if doc := os.Getenv("KEYROLL_RELIABILITY_DOC"); doc != "" && !t.Failed() {
		text := fmt.Sprintf("Measured by `TestFailingClustersDoNotDelayOthers` (test/isolation): %d healthy clusters (30 s leases, so a renewal every 20 s or so), first alone, then beside %d clusters whose Vault path is refused and %d whose Redis accepts connections and never answers; one rotation of every healthy cluster, %s into each window (%s alone, %s from the faulty clusters' creation on, when the operator takes all of them in, %s once they have settled); 16 workers. A rotation is asked for with the rotate-now annotation, which queues the cluster ahead of the work already queued (the 520 new clusters, in the busiest window), as renewals that are due are. A renewal's wait is from the time planned in its status (`nextRenewal`) to the renewal, to the second (status times are).\n\n%s",
			healthyN, refusedN, hangingN, rotateAt, window, faultWindow, window, table)
		if err := framework.WriteSection(doc, sectionBegin, sectionEnd, text); err != nil {
			t.Error(err)
		}
	}
}

// createMany creates n RedisClusters <prefix>000, ... of one node each through connection,
// from path, 16 at a time; they are left to the ground, which is the package's own.
func createMany(t *testing.T, ns, prefix string, n int, connection, path string) {
	t.Helper()
	framework.Parallel(t, n, 16, func(i int) error {
		rc := &v1beta1.RedisCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s%03d", prefix, i)},
			Spec: v1beta1.RedisClusterSpec{Replicas: 1, Version: framework.RedisVersion, Credentials: v1beta1.CredentialsSpec{
				Source:     v1beta1.SourceVaultLease,
				VaultLease: &v1beta1.VaultLeaseSource{ConnectionRef: v1beta1.ConnectionReference{Name: connection}, Path: path},
			}},
		}
		fw.Label(rc)
		return fw.Client.Create(context.Background(), rc)
	})
}

// faultsReported waits until every hanging cluster reports NodeUnreachable and every refused one
// a credential refused by Vault, or timeout; it returns how many of each did.
func faultsReported(t *testing.T, ns string, timeout time.Duration) (hanging, refused int) {
	t.Helper()
	for end := time.Now().Add(timeout); ; time.Sleep(2 * time.Second) {
		hanging, refused = 0, 0
		list := &v1beta1.RedisClusterList{}
		if err := fw.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for i := range list.Items {
			rc := &list.Items[i]
			switch {
			case strings.HasPrefix(rc.Name, hangingPrefix) && hasReason(rc, v1beta1.ReasonNodeUnreachable):
				hanging++
			case strings.HasPrefix(rc.Name, refusedPrefix) && rc.Status.Credential == nil && conditionFalse(rc, v1beta1.ConditionCredentialsReady):
				refused++
			}
		}
		if (hanging == hangingN && refused == refusedN) || time.Now().After(end) {
			return hanging, refused
		}
	}
}

func hasReason(rc *v1beta1.RedisCluster, reason string) bool {
	return slices.ContainsFunc(rc.Status.Conditions, func(c metav1.Condition) bool { return c.Reason == reason })
}

func conditionFalse(rc *v1beta1.RedisCluster, typ string) bool {
	c := framework.Condition(rc, typ)
	return c != nil && c.Status == metav1.ConditionFalse
}

// upkeep is what one window of watching the healthy clusters measured.
type upkeep struct {
	name   string
	window time.Duration
	// waits are the renewals' waits: from when each was planned to when it was done.
	waits []time.Duration
	// renewed counts each cluster's renewals.
	renewed map[string]int
	// rotations are the healthy clusters' rotations: from the request to the new credential
	// on the cluster's node, Ready.
	rotations []time.Duration
}

// watchUpkeep watches the healthy clusters of ns for a window, once a second, and asks every one
// of them for a rotation rotateAt into it.
func watchUpkeep(t *testing.T, ns string, window time.Duration) upkeep {
	u := upkeep{renewed: map[string]int{}, window: window}
	planned, renewedAt, version := map[string]time.Time{}, map[string]time.Time{}, map[string]string{}
	rotated := map[string]bool{}
	var askedAt time.Time
	for start := time.Now(); time.Since(start) < window; time.Sleep(time.Second) {
		list := &v1beta1.RedisClusterList{}
		if err := fw.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
			t.Error(err)
			return u
		}
		if askedAt.IsZero() && time.Since(start) >= rotateAt {
			askedAt = time.Now()
			for i := range list.Items {
				if rc := &list.Items[i]; strings.HasPrefix(rc.Name, healthyPrefix) {
					version[rc.Name] = rc.Status.Credential.Version
					rotateNow(t, rc)
				}
			}
		}
		for i := range list.Items {
			rc := &list.Items[i]
			c := rc.Status.Credential
			if !strings.HasPrefix(rc.Name, healthyPrefix) || c == nil {
				continue
			}
			if !askedAt.IsZero() && !rotated[rc.Name] && c.Version != version[rc.Name] && conditionTrue(rc, v1beta1.ConditionReady) {
				rotated[rc.Name] = true
				u.rotations = append(u.rotations, time.Since(askedAt))
			}
			if last := statusTime(c.Lease.LastRenewal); !last.IsZero() && !last.Equal(renewedAt[rc.Name]) {
				if p, ok := planned[rc.Name]; ok && !renewedAt[rc.Name].IsZero() {
					u.waits = append(u.waits, max(0, last.Sub(p)))
					u.renewed[rc.Name]++
				}
				renewedAt[rc.Name] = last
			}
			if next := statusTime(c.Lease.NextRenewal); !next.IsZero() {
				planned[rc.Name] = next
			}
		}
	}
	return u
}

// rotateNow asks for a rotation as fw.RotateNow does, from a goroutine of the test: it reports a
// failure without stopping the test.
func rotateNow(t *testing.T, rc *v1beta1.RedisCluster) {
	patch := client.MergeFrom(rc.DeepCopy())
	if rc.Annotations == nil {
		rc.Annotations = map[string]string{}
	}
	rc.Annotations[v1beta1.AnnotationRotateNow] = time.Now().UTC().Format(time.RFC3339Nano)
	if err := fw.Client.Patch(context.Background(), rc, patch); err != nil {
		t.Errorf("asking %s for a rotation: %v", rc.Name, err)
	}
}

func conditionTrue(rc *v1beta1.RedisCluster, typ string) bool {
	c := framework.Condition(rc, typ)
	return c != nil && c.Status == metav1.ConditionTrue
}

func statusTime(t *metav1.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

func (u upkeep) longest() time.Duration { return slowest(u.waits) }

// row is the window's line of the table.
func (u upkeep) row() string {
	return fmt.Sprintf("| %s | %d | %s | %s | %s | %s | %s |\n", u.name, len(u.waits),
		percentile(u.waits, 50), percentile(u.waits, 95), slowest(u.waits).Round(100*time.Millisecond),
		percentile(u.rotations, 50), slowest(u.rotations).Round(100*time.Millisecond))
}

func slowest(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds)
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.SortedFunc(slices.Values(ds), cmp.Compare)
	return s[min(len(s)-1, len(s)*p/100)].Round(100 * time.Millisecond)
}
