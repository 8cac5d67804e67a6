package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// The manager installed as a user installs it: `kubectl apply -k` of an overlay of deploy/default
// that points the image at the locally built one (make image). Its pods run under the restricted
// Pod Security Standard, one wins the leader election, it reaches the API server (through the
// kubernetes Service) and Vault (through the node's bridge), brings the sample RedisCluster
// (deploy/samples) to Ready on real Redis pods, and serves /metrics.
func TestManagerRunsAsAPodFromDeployDefault(t *testing.T) {
	// A cold build of the manager's static binary takes minutes on two cores; later ones seconds.
	imageCtx, cancelImage := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancelImage()
	start := time.Now()
	if err := fw.Ground.Node.LoadManagerImage(imageCtx); err != nil {
		t.Fatal(err)
	}
	t.Logf("make image and import: %s", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	start = time.Now()
	fw.StopOperator() // the in-process manager releases the Lease; the deployed one takes over
	t.Cleanup(func() {
		fw.UndeployManager(t)
		fw.RestartOperator(t)
	})
	fw.MustKubectl(t, nil, "apply", "-k", fw.ManagerOverlay(t, testground.RepoRoot(), testground.ManagerImage, true))
	pods := fw.WaitManagerReady(t, ctx, testground.ManagerImage, 2)
	checkRestricted(t, ctx, framework.ManagerNS)
	leader := waitLeaderIn(t, ctx, framework.ManagerNS, pods)
	t.Logf("manager pods Ready and %s leads, %s after apply", leader.Name, time.Since(start).Round(time.Millisecond))

	rc := applySamples(t, ctx, "samples")
	fw.WaitReady(t, rc, 3*time.Minute)
	t.Logf("sample RedisCluster orders Ready under the deployed manager, %s after apply", time.Since(start).Round(time.Millisecond))
	checkProbeSidecar(t, rc)
	checkMetrics(t, leader, rc.Namespace)
	fw.DeleteAndWait(t, rc, time.Minute)
}

// checkProbeSidecar: the deployed manager, given no --redis-probe-image, runs the Redis pods'
// probe sidecar from its own image (read from its pod), and the sidecar answers the kubelet.
func checkProbeSidecar(t *testing.T, rc *v1beta1.RedisCluster) {
	t.Helper()
	pods := fw.RedisPods(t, rc)
	if len(pods) == 0 {
		t.Fatal("no Redis pods of the sample cluster")
	}
	for _, p := range pods {
		if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Image != testground.ManagerImage {
			t.Errorf("Redis pod %s: init containers %v; want the probe sidecar from the manager's image %s", p.Name, p.Spec.InitContainers, testground.ManagerImage)
		}
		if !framework.PodReady(&p) {
			t.Errorf("Redis pod %s is not Ready", p.Name)
		}
	}
}

// checkRestricted asserts that namespace ns enforces the restricted Pod Security Standard: it
// says so, and a pod that breaks the standard is refused there.
func checkRestricted(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	got, err := fw.Clientset.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if level := got.Labels["pod-security.kubernetes.io/enforce"]; level != "restricted" {
		t.Errorf("namespace %s enforces %q, want restricted", ns, level)
	}
	rogue := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "rogue", Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: testground.RedisImage}}},
	}
	_, err = fw.Clientset.CoreV1().Pods(ns).Create(ctx, rogue, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) {
		t.Errorf("a pod without a restricted security context was not refused in %s: %v", ns, err)
	}
}

// waitLeaderIn waits until one of the manager pods holds the leader-election Lease in namespace
// ns.
func waitLeaderIn(t *testing.T, ctx context.Context, ns string, pods []corev1.Pod) corev1.Pod {
	t.Helper()
	var leader corev1.Pod
	framework.Eventually(t, time.Minute, func() string {
		l, err := fw.Clientset.CoordinationV1().Leases(ns).Get(ctx, "keyroll.keyroll.dev", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		for _, p := range pods {
			if strings.HasPrefix(holder, p.Name+"_") {
				leader = p
				return ""
			}
		}
		return fmt.Sprintf("the Lease is held by %q, not by a manager pod", holder)
	})
	return leader
}

// applySamples applies the samples' VaultConnection (pointed at the ground's Vault on the node's
// bridge), the RedisCluster orders and its consumer Deployment, under the package's names: the
// namespace base (the samples' is default), a VaultConnection vault-<base>, the operator's
// Kubernetes auth role and the package's Vault role orders (the samples name keyroll and orders).
// Every other field is the samples'.
func applySamples(t *testing.T, ctx context.Context, base string) *v1beta1.RedisCluster {
	t.Helper()
	ns, connection := fw.Namespace(t, base), fw.Name("vault-"+base)
	rc := &v1beta1.RedisCluster{}
	for _, f := range []string{"vaultconnection.yaml", "rediscluster-vaultlease.yaml", "consumer-deployment.yaml"} {
		b, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "samples", f))
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &obj.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		switch obj.GetKind() {
		case "VaultConnection":
			obj.SetName(connection)
			_ = unstructured.SetNestedField(obj.Object, fw.Ground.Vault.PodAddr, "spec", "address")
			_ = unstructured.SetNestedField(obj.Object, fw.OperatorRole, "spec", "auth", "kubernetes", "role")
			_ = unstructured.SetNestedStringSlice(obj.Object, []string{ns}, "spec", "allowedNamespaces")
			_ = unstructured.SetNestedStringSlice(obj.Object, []string{fw.Path("orders")}, "spec", "allowedPaths")
		case "RedisCluster":
			obj.SetNamespace(ns)
			_ = unstructured.SetNestedField(obj.Object, connection, "spec", "credentials", "vaultLease", "connectionRef", "name")
			_ = unstructured.SetNestedField(obj.Object, fw.Path("orders"), "spec", "credentials", "vaultLease", "path")
			rc.Namespace, rc.Name = ns, obj.GetName()
		default:
			obj.SetNamespace(ns)
		}
		fw.Label(obj) // the package's RedisCluster and VaultConnection, for its managers' --watch-selector
		if err := fw.Client.Create(ctx, obj); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		t.Cleanup(func() { _ = fw.Client.Delete(context.Background(), obj) })
	}
	return rc
}

// checkMetrics reads the leader's /metrics on its pod IP, over HTTPS (the manager's certificate is
// self-signed when no --metrics-cert-dir is given) with the token of a service account of
// namespace ns bound to keyroll-metrics-reader, as a scraper would.
func checkMetrics(t *testing.T, leader corev1.Pod, ns string) {
	t.Helper()
	ctx := context.Background()
	if err := fw.Ground.CP.EnsureServiceAccount(ctx, ns, "scraper"); err != nil {
		t.Fatal(err)
	}
	if err := fw.Ground.CP.BindClusterRole(ctx, "keyroll-metrics-reader", ns, "scraper"); err != nil {
		t.Fatal(err)
	}
	token, err := fw.Ground.CP.ServiceAccountToken(ctx, ns, "scraper", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+net.JoinHostPort(leader.Status.PodIP, "8443")+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the manager's certificate is self-signed
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("the manager's /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `controller_runtime_reconcile_total{controller="rediscluster"`) {
		t.Errorf("the manager's /metrics answered %s without RedisCluster reconcile counts:\n%.2000s", resp.Status, body)
	}
}
