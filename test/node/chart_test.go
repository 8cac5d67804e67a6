package node

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// The base of the chart's release name and of its namespace for this test (both fw.Name(chartBase)),
// a namespace of its own so that its objects do not meet those of deploy/default (which
// TestManagerRunsAsAPodFromDeployDefault installs): the release name contains "keyroll", so its
// objects are named node-keyroll-chart-*.
const chartBase = "keyroll-chart"

// The Helm chart installed with helm on the real node, into a namespace that enforces the
// restricted Pod Security Standard, with the locally built image (make image): both manager
// replicas become Ready, one wins the leader election, the chart's helm test passes, and it brings the sample RedisCluster to
// Ready on real Redis pods (its Vault login as the chart's service account, which the Kubernetes
// auth role is widened to bind).
func TestHelmChartInstallsAndRuns(t *testing.T) {
	imageCtx, cancelImage := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancelImage()
	if err := fw.Ground.Node.LoadManagerImage(imageCtx); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// The namespace first, so that its cleanup comes after the chart's uninstall.
	release, namespace := fw.Name(chartBase), fw.Namespace(t, chartBase)
	serviceAccount := release + "-manager"
	bindVaultRole(t, ctx, []string{framework.OperatorSA, serviceAccount}, []string{fw.OperatorNS, namespace})
	t.Cleanup(func() {
		bindVaultRole(t, context.Background(), []string{framework.OperatorSA}, []string{fw.OperatorNS})
	})

	start := time.Now()
	fw.StopOperator() // the in-process manager stops; the chart's takes over
	t.Cleanup(func() {
		uninstallChart(t, release, namespace)
		fw.RestartOperator(t)
	})
	fw.MustKubectl(t, nil, "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
	repo, tag, _ := strings.Cut(testground.ManagerImage, ":")
	out, err := render.Helm(t, []string{"KUBECONFIG=" + fw.Ground.CP.Kubeconfig}, "install", release, render.Chart(),
		"--namespace", namespace, "--set", "image.repository="+repo, "--set", "image.tag="+tag,
		// helm test's pod on the node's curl image: nothing is pulled.
		"--set", "test.image="+testground.CurlImage, "--set", "test.pullPolicy=Never",
		// On a shared ground, the RedisClusters and VaultConnections of this package alone, and
		// the status of those alone kept to the chart's manager (see statusSelector).
		"--set-json", fmt.Sprintf("extraArgs=[%q]", "--watch-selector="+fw.Selector().String()),
		"--set-json", statusSelector(),
		"--wait", "--timeout", "4m")
	if err != nil {
		t.Fatalf("helm install on the real node: %v\n%s", err, fw.PodSummary(namespace))
	}
	t.Logf("helm install: deployed and waited for, %s after start:\n%s", time.Since(start).Round(time.Millisecond), firstLines(out, 4))

	pods := chartManagerPods(t, ctx, release, namespace)
	leader := waitLeaderIn(t, ctx, namespace, pods)
	t.Logf("the chart's manager pods Ready on the real node and %s leads, %s after start", leader.Name, time.Since(start).Round(time.Millisecond))
	checkRestricted(t, ctx, namespace)
	helmTest(t, release, namespace)

	rc := applySamples(t, ctx, "chart-samples")
	fw.WaitReady(t, rc, 3*time.Minute)
	t.Logf("sample RedisCluster orders Ready under the chart's manager, %s after start", time.Since(start).Round(time.Millisecond))
	fw.DeleteAndWait(t, rc, time.Minute)
}

// helmTest runs the chart's helm test: its pod reads the managers' metrics through the metrics
// Service with the metrics reader's rights and is refused without them.
func helmTest(t *testing.T, release, namespace string) {
	t.Helper()
	out, err := render.Helm(t, []string{"KUBECONFIG=" + fw.Ground.CP.Kubeconfig}, "test", release, "--namespace", namespace, "--timeout", "2m")
	if err != nil || !regexp.MustCompile(`Phase:\s+Succeeded`).MatchString(out) {
		// A failed test's pod is kept: its log says which check failed.
		logs, _ := fw.Clientset.CoreV1().Pods(namespace).GetLogs(release+"-test-metrics", &corev1.PodLogOptions{}).DoRaw(context.Background())
		t.Fatalf("helm test: %v\n%s\nthe test pod's log:\n%s\n%s", err, out, logs, fw.PodSummary(namespace))
	}
	t.Logf("helm test:\n%s", out)
	pod := client.ObjectKey{Namespace: namespace, Name: release + "-test-metrics"}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		err := fw.Client.Get(context.Background(), pod, &corev1.Pod{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the passed test's pod %s is still there 30 s later (%v): hook-succeeded should delete it", pod, err)
			break
		}
	}
}

// bindVaultRole rewrites the operator's Kubernetes auth role in Vault to bind these service
// accounts in these namespaces.
func bindVaultRole(t *testing.T, ctx context.Context, accounts, namespaces []string) {
	t.Helper()
	role := fw.OperatorAuthRole(time.Hour)
	role.ServiceAccounts, role.Namespaces = accounts, namespaces
	if err := fw.Ground.Vault.WriteKubernetesAuthRole(ctx, role); err != nil {
		t.Fatalf("writing Vault's Kubernetes auth role: %v", err)
	}
}

// chartManagerPods lists the manager pods of the chart's release in namespace, which helm --wait
// has seen Ready; both must be on the real node and run the local image.
func chartManagerPods(t *testing.T, ctx context.Context, release, namespace string) []corev1.Pod {
	t.Helper()
	list, err := fw.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=manager,app.kubernetes.io/instance=" + release})
	if err != nil {
		t.Fatal(err)
	}
	var ready []corev1.Pod
	for _, p := range list.Items {
		if !framework.PodReady(&p) || p.DeletionTimestamp != nil {
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
		t.Fatalf("%d of 2 manager pods Ready after helm install --wait:%s", len(ready), fw.PodSummary(namespace))
	}
	return ready
}

// uninstallChart removes the release and its namespace and waits until the manager pods are gone,
// so that the in-process operator can lead again.
func uninstallChart(t *testing.T, release, namespace string) {
	if out, err := render.Helm(t, []string{"KUBECONFIG=" + fw.Ground.CP.Kubeconfig}, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "2m"); err != nil {
		t.Errorf("helm uninstall: %v\n%s", err, out)
	}
	framework.Eventually(t, 2*time.Minute, func() string {
		list, err := fw.Clientset.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(list.Items) > 0 {
			return fmt.Sprintf("pods still in %s: %v%s", namespace, err, fw.PodSummary(namespace))
		}
		return ""
	})
	_ = fw.Clientset.CoreV1().Namespaces().Delete(context.Background(), namespace, metav1.DeleteOptions{})
}

// firstLines returns the first n lines of s.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// statusSelector narrows the chart's policy on RedisClusters' status to this package's, as for an
// install beside another (admissionPolicies.redisClusterSelector): the other packages' operators
// write theirs as the ground's administrator.
func statusSelector() string {
	return fmt.Sprintf(`admissionPolicies.redisClusterSelector={"matchLabels":{%q:%q}}`, framework.LabelPackage, fw.Config.Name)
}
