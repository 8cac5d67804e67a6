package node

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/controllers/conversion"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

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

// TestUpgradeFromPreviousReleaseRestartsNothing: the previous release (built from Git history)
// installed on the real node holds two RedisClusters, one of each credential source, with
// consumers in pods, and rotates them; it is upgraded to the code under test with Helm (the CRDs
// applied first, as the docs say; the upgrade with kubectl apply -k deploy/default, from the
// previous release's own v1alpha1 CRDs, is test/apiversions' TestV1alpha1ObjectsSurviveTheUpgrade,
// which replaces the CRDs and needs a ground of its own). Across the upgrade and three minutes after it, every Redis container keeps its container ID and restart
// count, no consumer pod is restarted and no consumer command fails, no lease is issued or revoked
// (Vault's audit log), and every ledger entry and status field keeps its value; then a rotation
// works end to end under the new release.
func TestUpgradeFromPreviousReleaseRestartsNothing(t *testing.T) {
	prev := fw.Previous(t)
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
		repo, tag, _ := strings.Cut(framework.PreviousImage, ":")
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
		fw.UpgradeScenario(t, "helm", "node", auditLog, func() {
			stopConversion()
			fw.MustKubectl(t, nil, "apply", "--server-side", "--force-conflicts", "-k", filepath.Join(testground.RepoRoot(), "deploy", "crd"))
			repo, tag, _ := strings.Cut(testground.ManagerImage, ":")
			helm(render.Chart(), repo, tag, "upgrade", "--set-json", statusSelector()) // the previous chart has no such value
		}, nil)
	})
}

// TestTwoManagerVersionsDoNotFight: the previous release and the code under test run side by side
// on one leader-election Lease, as in a rolling upgrade of the manager, for two minutes and more,
// and the leadership moves between them three times: every Redis pod is restarted at most once
// (here: none is, as neither renders a change the other must undo).
func TestTwoManagerVersionsDoNotFight(t *testing.T) {
	prev := fw.Previous(t)
	fw.StopOperator()
	t.Cleanup(func() {
		fw.UndeployManager(t)
		fw.RestartOperator(t)
	})
	serveConversion(t)
	fw.MustKubectl(t, nil, "apply", "-k", fw.ManagerOverlay(t, prev, framework.PreviousImage, false))
	fw.WaitManagerReady(t, context.Background(), framework.PreviousImage, 2)
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
		l, err := fw.Clientset.CoordinationV1().Leases(framework.ManagerNS).Get(context.Background(), "keyroll.keyroll.dev", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	scale := func(n int32) {
		fw.MustKubectl(t, nil, "-n", framework.ManagerNS, "scale", "deployment/keyroll-manager", fmt.Sprintf("--replicas=%d", n))
	}
	// Each phase holds for 40 s while the pods are watched.
	hold := func(what string) {
		for end := time.Now().Add(40 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Second) {
			record()
		}
		t.Logf("%s: the Lease is held by %q", what, holder())
	}
	start := time.Now()
	hold(framework.PreviousRelease + " leads")
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
	fw.WaitManagerReady(t, context.Background(), framework.PreviousImage, 1)
	fw.StopOperator() // the new version stops and releases the Lease: the old one takes it back
	framework.Eventually(t, time.Minute, func() string {
		if h := holder(); !strings.HasPrefix(h, "keyroll-manager-") {
			return "the Lease is held by " + h
		}
		return ""
	})
	hold(framework.PreviousRelease + " leads again")
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
