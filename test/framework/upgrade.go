package framework

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// QuietAfterUpgrade is how long after an upgrade nothing may be restarted, issued or revoked.
const QuietAfterUpgrade = 3 * time.Minute

// UpgradeScene is what runs under a release before an upgrade: a RedisCluster of each credential
// source on the real node, each with consumers in pods. Its Vault role is role; AuditLog is the
// package's Vault audit log (EnableAudit), where the scene looks for leases issued and revoked.
type UpgradeScene struct {
	fw       *Framework
	ns, role string
	auditLog string
	clusters []*v1beta1.RedisCluster
	apps     []*Consumers
}

// UpgradeState is what must not change across an upgrade.
type UpgradeState struct {
	redis     map[string]string // pod -> uid, Redis container, restarts, probe sidecar
	consumers map[string]string // pod -> uid, restarts
	status    map[string]string // cluster -> ledger, credential, primary, nodes
	leases    []string
}

// StartUpgradeScene creates the scene in a namespace of its own (base) and waits until both
// clusters are Ready with their consumers running. It creates its objects through f.Client, so
// that a package can have them written at another API version.
func (f *Framework) StartUpgradeScene(t *testing.T, base, role, auditLog string) *UpgradeScene {
	t.Helper()
	ns := f.Namespace(t, base)
	sc := &UpgradeScene{fw: f, ns: ns, role: role, auditLog: auditLog}
	vc := f.VaultConnection(t, "vault-"+base, Allow(ns), Address(f.Ground.Vault.PodAddr))
	lease := f.RedisCluster(t, ns, "lease", vc.Name, f.Path(role), Replicas(3), WithConsumers("lease-app"))
	f.VaultDynamicSecret(t, ns, "redis-eso", role, true)
	eso := f.ExternalSecretCluster(t, ns, "eso", v1beta1.ExternalSecretSource{
		GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-eso"},
		RefreshInterval: &metav1.Duration{Duration: time.Hour},
		ConnectionRef:   &v1beta1.ConnectionReference{Name: vc.Name},
	}, Replicas(2), WithConsumers("eso-app"))
	for _, rc := range []*v1beta1.RedisCluster{lease, eso} {
		f.WaitReady(t, rc, 4*time.Minute)
		sc.clusters = append(sc.clusters, rc)
		sc.apps = append(sc.apps, f.StartConsumers(t, ns, rc.Name+"-app", 2, rc.Name+":6379", rc.Name+"-credentials"))
	}
	return sc
}

// Clusters are the scene's RedisClusters.
func (sc *UpgradeScene) Clusters() []*v1beta1.RedisCluster { return sc.clusters }

// Rotate asks every cluster for a rotation and waits until each runs a new credential everywhere
// and has revoked the one it replaced.
func (sc *UpgradeScene) Rotate(t *testing.T, why string) {
	t.Helper()
	f := sc.fw
	before := map[string]string{}
	for _, rc := range sc.clusters {
		before[rc.Name] = f.Get(t, rc).Status.Credential.Version
		f.Annotate(t, rc, v1beta1.AnnotationRotateNow, why)
	}
	Eventually(t, 5*time.Minute, func() string {
		for _, rc := range sc.clusters {
			cur := f.Get(t, rc)
			if cur.Status.RotateNowAcknowledged != why || cur.Status.Credential == nil || cur.Status.Credential.Version == before[rc.Name] ||
				cur.Status.Rollout != nil || len(cur.Status.Leases) > 1 || len(cur.Status.RetiringUsers) > 0 {
				return fmt.Sprintf("%s (%s): acknowledged %q, credential %+v, rollout %+v, leases %d, retiring %v", rc.Name, why,
					cur.Status.RotateNowAcknowledged, cur.Status.Credential, cur.Status.Rollout, len(cur.Status.Leases), cur.Status.RetiringUsers)
			}
		}
		return ""
	})
}

// State records what must stay as it is.
func (sc *UpgradeScene) State(t *testing.T) UpgradeState {
	t.Helper()
	f := sc.fw
	st := UpgradeState{redis: map[string]string{}, consumers: map[string]string{}, status: map[string]string{}}
	for _, rc := range sc.clusters {
		for _, p := range f.RedisPods(t, rc) {
			st.redis[p.Name] = fmt.Sprintf("%s %s", p.UID, containers(&p))
		}
		cur := f.Get(t, rc)
		c := cur.Status.Credential
		s := fmt.Sprintf("credential %s %s %s lease %s issued %v; primary %s; rotateNow %s;", c.Version, c.Username, c.Source, c.Lease.LeaseID, c.IssuedAt, cur.Status.Primary, cur.Status.RotateNowAcknowledged)
		for _, l := range cur.Status.Leases {
			s += fmt.Sprintf(" lease %s %s %s %s %s %v;", l.LeaseID, l.State, l.Username, l.Connection, l.TokenAccessor, l.IssuedAt)
			st.leases = append(st.leases, l.LeaseID)
		}
		for _, n := range cur.Status.Nodes {
			s += fmt.Sprintf(" node %s %s %s;", n.Pod, n.PodUID, n.UsersVersion)
		}
		st.status[rc.Name] = s
	}
	pods := &corev1.PodList{}
	if err := f.Client.List(context.Background(), pods, client.InNamespace(sc.ns)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if app := p.Labels["app"]; strings.HasSuffix(app, "-app") {
			st.consumers[p.Name] = fmt.Sprintf("%s %s", p.UID, containers(&p))
		}
	}
	return st
}

// containers names each container's run: its ID and restart count.
func containers(p *corev1.Pod) string {
	var b strings.Builder
	for _, c := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		fmt.Fprintf(&b, "%s=%s/%d ", c.Name, c.ContainerID, c.RestartCount)
	}
	return b.String()
}

// Failed sums the consumers' failed commands.
func (sc *UpgradeScene) Failed() (int64, []string) {
	var total int64
	var all []string
	for _, a := range sc.apps {
		_, f, failures := a.Totals()
		total += f
		all = append(all, failures...)
	}
	return total, all
}

// CheckQuiet holds the scene against what it was before the upgrade until QuietAfterUpgrade has
// passed since upgraded: every Redis container and consumer pod as it was, the status as it was,
// no failed command; and no lease of the scene's role issued in Vault, none revoked, in that time.
func (sc *UpgradeScene) CheckQuiet(t *testing.T, before UpgradeState, failedBefore int64, upgraded time.Time) {
	t.Helper()
	f := sc.fw
	diff := func(what string, a, b map[string]string) {
		if !maps.Equal(a, b) {
			for k := range a {
				if a[k] != b[k] {
					t.Errorf("%s %s changed across the upgrade:\nbefore: %s\nafter:  %s", what, k, a[k], b[k])
				}
			}
			for k := range b {
				if _, ok := a[k]; !ok {
					t.Errorf("%s %s appeared across the upgrade: %s", what, k, b[k])
				}
			}
		}
	}
	for end := upgraded.Add(QuietAfterUpgrade); ; time.Sleep(10 * time.Second) {
		now := sc.State(t)
		diff("Redis pod", before.redis, now.redis)
		diff("consumer pod", before.consumers, now.consumers)
		diff("status of RedisCluster", before.status, now.status)
		if t.Failed() || time.Now().After(end) {
			break
		}
	}
	if n, failures := sc.Failed(); n != failedBefore {
		t.Errorf("%d consumer commands failed across the upgrade: %v", n-failedBefore, failures)
	}
	entries, err := ReadAudit(sc.auditLog)
	if err != nil {
		t.Fatal(err)
	}
	hashed := map[string]string{}
	for _, id := range before.leases {
		if hashed[id], err = f.AuditHash(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range entries {
		if e.Time.Before(upgraded) {
			continue
		}
		if e.Issued(f.Path(sc.role)) {
			t.Errorf("a credential of %s was issued after the upgrade, at %s", f.Path(sc.role), e.Time)
		}
		if e.Type == "request" && strings.HasPrefix(e.Request.Path, "sys/leases/revoke") {
			for _, id := range before.leases {
				if e.Names(id, hashed[id]) {
					t.Errorf("lease %s was revoked after the upgrade, at %s", id, e.Time)
				}
			}
		}
	}
}

// UpgradeScenario runs the scene under the release installed, rotates it once, upgrades it with
// upgrade, and holds the scene against what it was for QuietAfterUpgrade; then quiet (when not
// nil) looks at the scene once more, and a rotation works end to end under the new release, and
// the clusters are deleted.
func (f *Framework) UpgradeScenario(t *testing.T, base, role, auditLog string, upgrade func(), quiet func(*UpgradeScene, time.Time)) {
	t.Helper()
	start := time.Now()
	sc := f.StartUpgradeScene(t, "upgrade-"+base, role, auditLog)
	sc.Rotate(t, "before-upgrade")
	t.Logf("under %s: two RedisClusters Ready with consumers and rotated, %s after start", PreviousRelease, time.Since(start).Round(time.Second))
	time.Sleep(10 * time.Second) // the rotation's last status writes settle
	before := sc.State(t)
	failedBefore, _ := sc.Failed()
	upgraded := time.Now()
	upgrade()
	t.Logf("upgraded to the code under test in %s; holding the scene for %s", time.Since(upgraded).Round(time.Second), QuietAfterUpgrade)
	sc.CheckQuiet(t, before, failedBefore, upgraded)
	if quiet != nil && !t.Failed() {
		quiet(sc, upgraded)
	}
	if t.Failed() {
		return
	}
	sc.Rotate(t, "after-upgrade")
	if n, failures := sc.Failed(); n != failedBefore {
		t.Errorf("%d consumer commands failed in the rotation after the upgrade: %v", n-failedBefore, failures)
	}
	t.Logf("a rotation of both clusters under the new release: done, %s after start", time.Since(start).Round(time.Second))
	for _, rc := range sc.clusters {
		f.DeleteAndWait(t, rc, 2*time.Minute)
	}
}
