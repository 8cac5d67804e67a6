package node

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/conversion"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// The release an upgrade is tested from: its tag and its commit (a clone holds the commit whether
// or not it fetched the tag). Each release moves these to the one before it.
const (
	previousRelease = "v0.1.0"
	previousCommit  = "86eddba18341ad48fd58095a7d414b63b280ee21"
	previousImage   = "localhost/keyroll/keyroll:" + previousRelease
)

// quietAfterUpgrade is how long after an upgrade nothing may be restarted, issued or revoked.
const quietAfterUpgrade = 3 * time.Minute

var (
	previousOnce sync.Once
	previousDir  string
	previousErr  error
)

// previousTree checks the previous release out of Git history into a worktree of its own and
// loads its manager image (its own make image) into the node's containerd, once per run.
func previousTree(t *testing.T) string {
	t.Helper()
	previousOnce.Do(func() {
		dir := filepath.Join(fw.Ground.Dir, "keyroll-"+previousRelease)
		root := testground.RepoRoot()
		if out, err := exec.Command("git", "-C", root, "worktree", "add", "--force", "--detach", dir, previousCommit).CombinedOutput(); err != nil {
			previousErr = fmt.Errorf("checking out %s (%s) from Git history: %w: %s", previousRelease, previousCommit, err, out)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		archive := filepath.Join(dir, "keyroll-image.tar")
		cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "image", "IMG="+previousImage, "IMAGE_ARCHIVE="+archive)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			previousErr = fmt.Errorf("make image of %s: %w: %s", previousRelease, err, out)
			return
		}
		previousDir, previousErr = dir, fw.Ground.Node.ImportImage(archive)
	})
	if previousErr != nil {
		t.Fatal(previousErr)
	}
	return previousDir
}

// serveConversion runs keyroll's conversion webhook in the test process, until stop or the end of
// the test: the previous release's manager reads and writes v1alpha1, which this release's CRDs
// (the ground's from its start) convert to and from v1beta1, the storage version, through the
// webhook. The manager of the code under test, once deployed, points the CRDs at its own.
func serveConversion(t *testing.T) (stop func()) {
	t.Helper()
	op, err := fw.NewOperator(context.Background(), framework.OperatorOptions{Conversion: &conversion.Options{}, ConversionOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = op.Stop()
			// The CRDs as this release ships them name the webhook's Service, not this URL: an
			// apply of them would merge the Service into the URL, which the API server refuses.
			patch := []byte(`{"spec":{"conversion":{"webhook":{"clientConfig":{"url":null,"caBundle":null,` +
				`"service":{"name":"keyroll-webhook","namespace":"keyroll-system","path":"/convert","port":443}}}}}}`)
			for _, name := range conversion.CRDs {
				crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}}
				if err := fw.Client.Patch(context.Background(), crd, client.RawPatch(types.MergePatchType, patch)); err != nil {
					t.Errorf("pointing %s back at the shipped Service: %v", name, err)
				}
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// removePreviousTree removes the worktree once the package's tests are done.
func removePreviousTree() {
	if previousDir != "" {
		_ = exec.Command("git", "-C", testground.RepoRoot(), "worktree", "remove", "--force", previousDir).Run()
	}
}

// upgradeScene is what runs under the previous release: a RedisCluster of each credential source,
// each with consumers in pods, both rotated once.
type upgradeScene struct {
	ns       string
	clusters []*v1beta1.RedisCluster
	apps     []*framework.Consumers
	role     string
}

// sceneState is what must not change across an upgrade.
type sceneState struct {
	redis     map[string]string // pod -> uid, Redis container, restarts, probe sidecar
	consumers map[string]string // pod -> uid, restarts
	status    map[string]string // cluster -> ledger, credential, primary, nodes
	leases    []string
}

func startScene(t *testing.T, base string) *upgradeScene {
	t.Helper()
	ns := fw.Namespace(t, base)
	sc := &upgradeScene{ns: ns, role: "node"}
	vc := fw.VaultConnection(t, "vault-"+base, framework.Allow(ns), framework.Address(fw.Ground.Vault.PodAddr))
	lease := fw.RedisCluster(t, ns, "lease", vc.Name, fw.Path(sc.role), framework.Replicas(3), framework.WithConsumers("lease-app"))
	fw.VaultDynamicSecret(t, ns, "redis-eso", sc.role, true)
	eso := fw.ExternalSecretCluster(t, ns, "eso", v1beta1.ExternalSecretSource{
		GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-eso"},
		RefreshInterval: &metav1.Duration{Duration: time.Hour},
		ConnectionRef:   &v1beta1.ConnectionReference{Name: vc.Name},
	}, framework.Replicas(2), framework.WithConsumers("eso-app"))
	for _, rc := range []*v1beta1.RedisCluster{lease, eso} {
		fw.WaitReady(t, rc, 4*time.Minute)
		sc.clusters = append(sc.clusters, rc)
		sc.apps = append(sc.apps, fw.StartConsumers(t, ns, rc.Name+"-app", 2, rc.Name+":6379", rc.Name+"-credentials"))
	}
	return sc
}

// rotate asks every cluster for a rotation and waits until each runs a new credential everywhere
// and has revoked the one it replaced.
func (sc *upgradeScene) rotate(t *testing.T, why string) {
	t.Helper()
	before := map[string]string{}
	for _, rc := range sc.clusters {
		cur := fw.Get(t, rc)
		before[rc.Name] = cur.Status.Credential.Version
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Annotations = map[string]string{v1beta1.AnnotationRotateNow: why}
		if err := fw.Client.Patch(context.Background(), cur, patch); err != nil {
			t.Fatal(err)
		}
	}
	framework.Eventually(t, 5*time.Minute, func() string {
		for _, rc := range sc.clusters {
			cur := fw.Get(t, rc)
			if cur.Status.RotateNowAcknowledged != why || cur.Status.Credential == nil || cur.Status.Credential.Version == before[rc.Name] ||
				cur.Status.Rollout != nil || len(cur.Status.Leases) > 1 || len(cur.Status.RetiringUsers) > 0 {
				return fmt.Sprintf("%s (%s): acknowledged %q, credential %+v, rollout %+v, leases %d, retiring %v", rc.Name, why,
					cur.Status.RotateNowAcknowledged, cur.Status.Credential, cur.Status.Rollout, len(cur.Status.Leases), cur.Status.RetiringUsers)
			}
		}
		return ""
	})
}

// state records what must stay as it is.
func (sc *upgradeScene) state(t *testing.T) sceneState {
	t.Helper()
	st := sceneState{redis: map[string]string{}, consumers: map[string]string{}, status: map[string]string{}}
	for _, rc := range sc.clusters {
		for _, p := range fw.RedisPods(t, rc) {
			st.redis[p.Name] = fmt.Sprintf("%s %s", p.UID, containers(&p))
		}
		cur := fw.Get(t, rc)
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
	if err := fw.Client.List(context.Background(), pods, client.InNamespace(sc.ns)); err != nil {
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

// failed sums the consumers' failed commands.
func (sc *upgradeScene) failed() (int64, []string) {
	var total int64
	var all []string
	for _, a := range sc.apps {
		_, f, failures := a.Totals()
		total += f
		all = append(all, failures...)
	}
	return total, all
}

// checkQuiet holds the scene against what it was before the upgrade until the quiet period is
// over: every Redis container and consumer pod as it was, the status as it was, no failed command;
// and no lease of the package's role issued in Vault, none revoked, in that time.
func (sc *upgradeScene) checkQuiet(t *testing.T, before sceneState, failedBefore int64, upgraded time.Time) {
	t.Helper()
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
	for end := upgraded.Add(quietAfterUpgrade); ; time.Sleep(10 * time.Second) {
		now := sc.state(t)
		diff("Redis pod", before.redis, now.redis)
		diff("consumer pod", before.consumers, now.consumers)
		diff("status of RedisCluster", before.status, now.status)
		if t.Failed() || time.Now().After(end) {
			break
		}
	}
	if f, failures := sc.failed(); f != failedBefore {
		t.Errorf("%d consumer commands failed across the upgrade: %v", f-failedBefore, failures)
	}
	entries, err := framework.ReadAudit(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	hashed := map[string]string{}
	for _, id := range before.leases {
		if hashed[id], err = fw.AuditHash(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range entries {
		if e.Time.Before(upgraded) {
			continue
		}
		if e.Issued(fw.Path(sc.role)) {
			t.Errorf("a credential of %s was issued after the upgrade, at %s", fw.Path(sc.role), e.Time)
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

// TestUpgradeFromPreviousReleaseRestartsNothing: the previous release (built from Git history)
// installed on the real node holds two RedisClusters, one of each credential source, with
// consumers in pods, and rotates them; it is upgraded to the code under test, with Helm (the CRDs
// applied first, as the docs say) and, separately, with kubectl apply -k deploy/default. Across the
// upgrade and three minutes after it, every Redis container keeps its container ID and restart
// count, no consumer pod is restarted and no consumer command fails, no lease is issued or revoked
// (Vault's audit log), and every ledger entry and status field keeps its value; then a rotation
// works end to end under the new release.
func TestUpgradeFromPreviousReleaseRestartsNothing(t *testing.T) {
	prev := previousTree(t)
	imageCtx, cancelImage := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancelImage()
	if err := fw.Ground.Node.LoadManagerImage(imageCtx); err != nil {
		t.Fatal(err)
	}
	t.Run("Helm", func(t *testing.T) {
		release, namespace := fw.Name("keyroll-upgrade"), fw.Namespace(t, "keyroll-upgrade")
		bindVaultRole(t, context.Background(), []string{framework.OperatorSA, release + "-manager"}, []string{fw.OperatorNS, namespace})
		t.Cleanup(func() {
			bindVaultRole(t, context.Background(), []string{framework.OperatorSA}, []string{fw.OperatorNS})
		})
		fw.StopOperator()
		t.Cleanup(func() {
			uninstallChart(t, release, namespace)
			fw.RestartOperator(t)
		})
		stopConversion := serveConversion(t)
		repo, tag, _ := strings.Cut(previousImage, ":")
		helm := func(chart, repo, tag, verb string, extra ...string) {
			t.Helper()
			args := append([]string{verb, release, chart, "--namespace", namespace, "--set", "image.repository=" + repo, "--set", "image.tag=" + tag,
				"--set", "test.enabled=false", "--set-json", fmt.Sprintf("extraArgs=[%q]", "--watch-selector="+fw.Selector().String()),
				"--wait", "--timeout", "4m"}, extra...)
			if out, err := render.Helm(t, []string{"KUBECONFIG=" + fw.Ground.CP.Kubeconfig}, args...); err != nil {
				t.Fatalf("helm %s: %v\n%s\n%s", verb, err, out, fw.PodSummary(namespace))
			}
		}
		helm(filepath.Join(prev, "deploy", "helm", "keyroll"), repo, tag, "install")
		upgradeScenario(t, "helm", func() {
			stopConversion()
			fw.MustKubectl(t, nil, "apply", "--server-side", "--force-conflicts", "-k", filepath.Join(testground.RepoRoot(), "deploy", "crd"))
			repo, tag, _ := strings.Cut(testground.ManagerImage, ":")
			helm(render.Chart(), repo, tag, "upgrade")
		})
	})
	t.Run("Kustomize", func(t *testing.T) {
		fw.StopOperator()
		t.Cleanup(func() {
			undeployManager(t)
			fw.RestartOperator(t)
		})
		stopConversion := serveConversion(t)
		fw.MustKubectl(t, nil, "apply", "-k", managerOverlay(t, prev, previousImage))
		waitManagerReady(t, context.Background(), previousImage, 2)
		upgradeScenario(t, "kustomize", func() {
			stopConversion()
			fw.MustKubectl(t, nil, "apply", "-k", managerOverlay(t, testground.RepoRoot(), testground.ManagerImage))
			waitManagerReady(t, context.Background(), testground.ManagerImage, 2)
		})
	})
}

// upgradeScenario runs the scene under the installed previous release, upgrades it with upgrade,
// and holds the scene against what it was.
func upgradeScenario(t *testing.T, base string, upgrade func()) {
	t.Helper()
	start := time.Now()
	sc := startScene(t, "upgrade-"+base)
	sc.rotate(t, "before-upgrade")
	t.Logf("under %s: two RedisClusters Ready with consumers and rotated, %s after start", previousRelease, time.Since(start).Round(time.Second))
	time.Sleep(10 * time.Second) // the rotation's last status writes settle
	before := sc.state(t)
	failedBefore, _ := sc.failed()
	upgraded := time.Now()
	upgrade()
	t.Logf("upgraded to the code under test in %s; holding the scene for %s", time.Since(upgraded).Round(time.Second), quietAfterUpgrade)
	sc.checkQuiet(t, before, failedBefore, upgraded)
	if t.Failed() {
		return
	}
	sc.rotate(t, "after-upgrade")
	if f, failures := sc.failed(); f != failedBefore {
		t.Errorf("%d consumer commands failed in the rotation after the upgrade: %v", f-failedBefore, failures)
	}
	t.Logf("a rotation of both clusters under the new release: done, %s after start", time.Since(start).Round(time.Second))
	for _, rc := range sc.clusters {
		fw.DeleteAndWait(t, rc, 2*time.Minute)
	}
}

// TestTwoManagerVersionsDoNotFight: the previous release and the code under test run side by side
// on one leader-election Lease, as in a rolling upgrade of the manager, for two minutes and more,
// and the leadership moves between them three times: every Redis pod is restarted at most once
// (here: none is, as neither renders a change the other must undo).
func TestTwoManagerVersionsDoNotFight(t *testing.T) {
	prev := previousTree(t)
	fw.StopOperator()
	t.Cleanup(func() {
		undeployManager(t)
		fw.RestartOperator(t)
	})
	serveConversion(t)
	fw.MustKubectl(t, nil, "apply", "-k", managerOverlay(t, prev, previousImage))
	waitManagerReady(t, context.Background(), previousImage, 2)
	ns := fw.Namespace(t, "two-versions")
	vc := fw.VaultConnection(t, "vault-two-versions", framework.Allow(ns), framework.Address(fw.Ground.Vault.PodAddr))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("node"), framework.Replicas(3))
	fw.WaitReady(t, rc, 4*time.Minute)
	defer fw.DeleteAndWait(t, rc, 2*time.Minute)
	uids := map[string]map[string]bool{}
	record := func() {
		for _, p := range fw.RedisPods(t, rc) {
			if uids[p.Name] == nil {
				uids[p.Name] = map[string]bool{}
			}
			uids[p.Name][string(p.UID)] = true
		}
	}
	record()
	holder := func() string {
		l, err := fw.Clientset.CoordinationV1().Leases(managerNS).Get(context.Background(), "keyroll.keyroll.dev", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	scale := func(n int32) {
		fw.MustKubectl(t, nil, "-n", managerNS, "scale", "deployment/keyroll-manager", fmt.Sprintf("--replicas=%d", n))
	}
	// Each phase holds for 40 s while the pods are watched.
	hold := func(what string) {
		for end := time.Now().Add(40 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Second) {
			record()
		}
		t.Logf("%s: the Lease is held by %q", what, holder())
	}
	start := time.Now()
	hold(previousRelease + " leads")
	if err := fw.StartOperator(*fw.Config.Operator); err != nil { // the new version joins
		t.Fatal(err)
	}
	scale(0) // the old version's pods stop and release the Lease: the new one takes it
	framework.Eventually(t, time.Minute, func() string {
		if h := holder(); strings.HasPrefix(h, "keyroll-manager-") || h == "" {
			return "the Lease is still held by " + h
		}
		return ""
	})
	hold("the code under test leads")
	scale(1)
	waitManagerReady(t, context.Background(), previousImage, 1)
	fw.StopOperator() // the new version stops and releases the Lease: the old one takes it back
	framework.Eventually(t, time.Minute, func() string {
		if h := holder(); !strings.HasPrefix(h, "keyroll-manager-") {
			return "the Lease is held by " + h
		}
		return ""
	})
	hold(previousRelease + " leads again")
	if time.Since(start) < 2*time.Minute {
		hold("both run")
	}
	for name, seen := range uids {
		if len(seen) > 2 {
			t.Errorf("Redis pod %s was restarted %d times while the two versions took turns", name, len(seen)-1)
		}
	}
	fw.WaitReady(t, rc, time.Minute)
	t.Logf("two manager versions took turns for %s; Redis pods and the runs each had: %v", time.Since(start).Round(time.Second), uids)
}
