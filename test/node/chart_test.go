package node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// The chart's release for this test, in a namespace of its own so that its objects do not meet
// those of deploy/default (which TestManagerRunsAsAPodFromDeployDefault installs): the release
// name contains "keyroll", so its objects are named keyroll-chart-*.
const (
	chartRelease   = "keyroll-chart"
	chartNamespace = "keyroll-chart"
)

// The Helm chart installed with helm on the real node, into a namespace that enforces the
// restricted Pod Security Standard, with the locally built image (make image): both manager
// replicas become Ready, one wins the leader election, and it brings the sample RedisCluster to
// Ready on real Redis pods (its Vault login as the chart's service account, which the Kubernetes
// auth role is widened to bind).
func TestHelmChartInstallsAndRuns(t *testing.T) {
	imageCtx, cancelImage := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancelImage()
	if err := ground.Node.LoadManagerImage(imageCtx); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	serviceAccount := chartRelease + "-manager"
	bindVaultRole(t, ctx, []string{harness.OperatorSA, serviceAccount}, []string{harness.OperatorNS, chartNamespace})
	t.Cleanup(func() {
		bindVaultRole(t, context.Background(), []string{harness.OperatorSA}, []string{harness.OperatorNS})
	})

	start := time.Now()
	stopOperator() // the in-process manager stops; the chart's takes over
	t.Cleanup(func() {
		uninstallChart(t)
		if err := startOperator(); err != nil {
			t.Errorf("restarting the in-process operator: %v", err)
		}
	})
	kubectl(t, "create", "namespace", chartNamespace)
	kubectl(t, "label", "namespace", chartNamespace, "pod-security.kubernetes.io/enforce=restricted")
	repo, tag, _ := strings.Cut(testground.ManagerImage, ":")
	out, err := render.Helm(t, []string{"KUBECONFIG=" + ground.CP.Kubeconfig}, "install", chartRelease, render.Chart(),
		"--namespace", chartNamespace, "--set", "image.repository="+repo, "--set", "image.tag="+tag,
		"--wait", "--timeout", "4m")
	if err != nil {
		t.Fatalf("helm install on the real node: %v\n%s", err, podSummary(chartNamespace))
	}
	t.Logf("helm install: deployed and waited for, %s after start:\n%s", time.Since(start).Round(time.Millisecond), firstLines(out, 4))

	pods := chartManagerPods(t, ctx)
	leader := waitLeaderIn(t, ctx, chartNamespace, pods)
	t.Logf("the chart's manager pods Ready on the real node and %s leads, %s after start", leader.Name, time.Since(start).Round(time.Millisecond))
	checkRestricted(t, ctx, chartNamespace)

	rc := applySamples(t, ctx)
	waitReady(t, client.ObjectKeyFromObject(rc), 3*time.Minute)
	t.Logf("sample RedisCluster orders Ready under the chart's manager, %s after start", time.Since(start).Round(time.Millisecond))
	deleteAndWait(t, rc)
}

// bindVaultRole rewrites the operator's Kubernetes auth role in Vault to bind these service
// accounts in these namespaces.
func bindVaultRole(t *testing.T, ctx context.Context, accounts, namespaces []string) {
	t.Helper()
	err := ground.Vault.WriteKubernetesAuthRole(ctx, testground.KubernetesAuthRole{
		Name: harness.OperatorRole, ServiceAccounts: accounts, Namespaces: namespaces,
		Policies: []string{harness.OperatorRole}, TokenTTL: time.Hour,
	})
	if err != nil {
		t.Fatalf("writing Vault's Kubernetes auth role: %v", err)
	}
}

// chartManagerPods lists the chart's manager pods, which helm --wait has seen Ready; both must be
// on the real node and run the local image.
func chartManagerPods(t *testing.T, ctx context.Context) []corev1.Pod {
	t.Helper()
	list, err := cs.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=manager,app.kubernetes.io/instance=" + chartRelease})
	if err != nil {
		t.Fatal(err)
	}
	var ready []corev1.Pod
	for _, p := range list.Items {
		if !podReady(&p) || p.DeletionTimestamp != nil {
			continue
		}
		if p.Spec.NodeName != testground.RealNodeName {
			t.Errorf("manager pod %s is on node %s, want the real node", p.Name, p.Spec.NodeName)
		}
		if img := p.Spec.Containers[0].Image; img != testground.ManagerImage {
			t.Errorf("manager pod %s runs %s, want the locally built %s", p.Name, img, testground.ManagerImage)
		}
		ready = append(ready, p)
	}
	if len(ready) != 2 {
		t.Fatalf("%d of 2 manager pods Ready after helm install --wait:%s", len(ready), podSummary(chartNamespace))
	}
	return ready
}

// uninstallChart removes the release and its namespace and waits until the manager pods are gone,
// so that the in-process operator can lead again.
func uninstallChart(t *testing.T) {
	if out, err := render.Helm(t, []string{"KUBECONFIG=" + ground.CP.Kubeconfig}, "uninstall", chartRelease, "--namespace", chartNamespace, "--wait", "--timeout", "2m"); err != nil {
		t.Errorf("helm uninstall: %v\n%s", err, out)
	}
	eventually(t, 2*time.Minute, func() string {
		list, err := cs.CoreV1().Pods(chartNamespace).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(list.Items) > 0 {
			return fmt.Sprintf("pods still in %s: %v%s", chartNamespace, err, podSummary(chartNamespace))
		}
		return ""
	})
	_ = cs.CoreV1().Namespaces().Delete(context.Background(), chartNamespace, metav1.DeleteOptions{})
}

// firstLines returns the first n lines of s.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
