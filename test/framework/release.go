package framework

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/test/testground"
)

// ManagerNS is the namespace deploy/default installs the manager in: its kustomization fixes it,
// so that it cannot carry a package's prefix. The deployed manager's service account and
// leader-election Lease are there; a package that deploys the manager runs its operator there too
// (OperatorNS), so that the two take turns on one Lease.
const ManagerNS = "keyroll-system"

// The release an upgrade is tested from: its tag and its commit (a clone holds the commit whether
// or not it fetched the tag). Each release moves these to the one before it.
const (
	PreviousRelease = "v0.1.0"
	previousCommit  = "86eddba18341ad48fd58095a7d414b63b280ee21"
	PreviousImage   = "localhost/keyroll/keyroll:" + PreviousRelease
)

// Previous checks the previous release out of Git history into a worktree of its own and loads its
// manager image (its own make image) into the node's containerd, once per package; it returns the
// worktree, which Run removes once the package's tests are done.
func (f *Framework) Previous(t testing.TB) string {
	t.Helper()
	f.previousOnce.Do(func() {
		dir := filepath.Join(f.Ground.Dir, "keyroll-"+PreviousRelease)
		root := testground.RepoRoot()
		if out, err := exec.Command("git", "-C", root, "worktree", "add", "--force", "--detach", dir, previousCommit).CombinedOutput(); err != nil {
			f.previousErr = fmt.Errorf("checking out %s (%s) from Git history: %w: %s", PreviousRelease, previousCommit, err, out)
			return
		}
		f.previousDir = dir
		// A cold build of another tree's manager (its own dependencies, beside the suite's load)
		// takes many minutes on a fresh machine; the bound is for a build that hangs.
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
		defer cancel()
		archive := filepath.Join(dir, "keyroll-image.tar")
		cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "image", "IMG="+PreviousImage, "IMAGE_ARCHIVE="+archive)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			f.previousErr = fmt.Errorf("make image of %s: %w: %s", PreviousRelease, err, out)
			return
		}
		f.previousErr = f.Ground.Node.ImportImage(archive)
	})
	if f.previousErr != nil {
		t.Fatal(f.previousErr)
	}
	return f.previousDir
}

// removePrevious removes the previous release's worktree, if Previous made one.
func (f *Framework) removePrevious() {
	if f.previousDir != "" {
		_ = exec.Command("git", "-C", testground.RepoRoot(), "worktree", "remove", "--force", f.previousDir).Run()
	}
}

// ManagerOverlay writes a kustomization that takes deploy/default of the tree root and sets the
// manager's image, and returns its directory: `kubectl apply -k` of it installs keyroll as a user
// does, with two changes: the manager handles the package's RedisClusters and VaultConnections
// alone (--watch-selector), and the admission policy that keeps every RedisCluster's status to the
// manager's service account is left out (the operators in the test processes write status as the
// ground's administrator, on a shared ground those of every package; the policy that bounds the
// manager's own writes stays, and holds the deployed manager). With crds false it leaves the
// tree's CRDs out: on a shared ground the ground's CRDs, this tree's, are a superset of an earlier
// release's, and the other packages use their new fields (an older CRD would have the API server
// prune them).
func (f *Framework) ManagerOverlay(t testing.TB, root, image string, crds bool) string {
	t.Helper()
	dir := t.TempDir()
	base, err := filepath.Rel(dir, filepath.Join(root, "deploy", "default"))
	if err != nil {
		t.Fatal(err)
	}
	name, tag, _ := strings.Cut(image, ":")
	k := fmt.Sprintf("resources:\n- %s\nimages:\n- name: keyroll\n  newName: %s\n  newTag: %s\n", base, name, tag) +
		fmt.Sprintf("patches:\n- target: {kind: Deployment}\n  patch: |-\n    - op: add\n      path: /spec/template/spec/containers/0/args/-\n      value: %q\n",
			"--watch-selector="+f.Selector().String()) +
		// The policy and its binding share the name; an earlier release has neither.
		"- target: {group: admissionregistration.k8s.io, name: keyroll-redisclusters-status}\n  patch: |-\n    $patch: delete\n" +
		"    apiVersion: admissionregistration.k8s.io/v1\n    kind: ValidatingAdmissionPolicy\n    metadata:\n      name: any\n"
	if !crds {
		k += "- target: {kind: CustomResourceDefinition}\n  patch: |-\n    $patch: delete\n    apiVersion: apiextensions.k8s.io/v1\n    kind: CustomResourceDefinition\n    metadata:\n      name: any\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// WaitManagerReady waits until want replicas of the deployed manager are Ready, on the real node,
// running image.
func (f *Framework) WaitManagerReady(t testing.TB, ctx context.Context, image string, want int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	Eventually(t, 3*time.Minute, func() string {
		list, err := f.Clientset.CoreV1().Pods(ManagerNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=manager"})
		if err != nil {
			return err.Error()
		}
		pods = nil
		for _, p := range list.Items {
			if PodReady(&p) && p.Spec.NodeName == testground.RealNodeName && p.DeletionTimestamp == nil && p.Spec.Containers[0].Image == image {
				pods = append(pods, p)
			}
		}
		if len(pods) < want {
			return fmt.Sprintf("%d of %d manager pods of %s Ready:%s", len(pods), want, image, f.PodSummary(ManagerNS))
		}
		return ""
	})
	return pods
}

// UndeployManager scales the deployed manager to zero and waits until its pods are gone (their
// Lease is released), so that the in-process operator can lead again.
func (f *Framework) UndeployManager(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	d := &appsv1.Deployment{}
	key := client.ObjectKey{Namespace: ManagerNS, Name: "keyroll-manager"}
	if err := f.Client.Get(ctx, key, d); err != nil {
		return
	}
	d.Spec.Replicas = ptr.To[int32](0)
	if err := f.Client.Update(ctx, d); err != nil {
		t.Errorf("scaling the manager down: %v", err)
		return
	}
	Eventually(t, time.Minute, func() string {
		list, err := f.Clientset.CoreV1().Pods(ManagerNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=manager"})
		if err != nil || len(list.Items) > 0 {
			return fmt.Sprintf("manager pods still there: %s", f.PodSummary(ManagerNS))
		}
		return ""
	})
}
