package dataplane

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// staged is the credential keyroll holds for a cluster before any consumer has it.
func staged(t testing.TB, rc *v1beta1.RedisCluster) (user, pass string) {
	t.Helper()
	return fw.SecretData(rc.Namespace, rc.Name+"-keyroll", "username"), fw.SecretData(rc.Namespace, rc.Name+"-keyroll", "password")
}

// firstAccepted polls every node until it accepts user, and returns when each first did.
func firstAccepted(t *testing.T, pods []corev1.Pod, user, pass string, timeout time.Duration) map[string]time.Time {
	t.Helper()
	var mu sync.Mutex
	out := map[string]time.Time{}
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				if accepts(framework.PodAddr(&p), user, pass) {
					mu.Lock()
					out[p.Name] = time.Now()
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(out) != len(pods) {
		t.Fatalf("within %s only %v accepted the new user", timeout, out)
	}
	return out
}

// watchPublished checks, at every write of the consumers' Secret, that every node already
// accepts the credential it holds: consumers cannot have a credential before that write.
func watchPublished(t *testing.T, rc *v1beta1.RedisCluster, pods []corev1.Pod) (check func() []string) {
	t.Helper()
	w, err := fw.Clientset.CoreV1().Secrets(rc.Namespace).Watch(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=" + rc.Name + "-credentials"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var problems []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*corev1.Secret)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			user, pass := string(s.Data["username"]), string(s.Data["password"])
			for _, p := range pods {
				if !accepts(framework.PodAddr(&p), user, pass) {
					mu.Lock()
					problems = append(problems, fmt.Sprintf("Secret written with user %s while %s did not accept it", user, p.Name))
					mu.Unlock()
				}
			}
		}
	}()
	return func() []string {
		w.Stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return problems
	}
}

// A rotation puts the new user on every node before any consumer gets it: per node, when the new
// user first logs in there; per consumer pod, when it first runs on the new credential; every
// consumer time is later than every node time. And at every write of the consumers' Secret,
// every node already accepts what it holds.
func TestNewCredentialReachesEveryNodeBeforeAnyConsumer(t *testing.T) {
	ns := fw.Namespace(t, "order")
	vc := fw.VaultConnection(t, "vault-order", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("app"))
	fw.WaitReady(t, rc, 3*time.Minute)
	pods := fw.RedisPods(t, rc)
	app := fw.StartConsumers(t, ns, "app", 2, "cache:6379", "cache-credentials")
	checkPublished := watchPublished(t, rc, pods)
	oldUser, _ := staged(t, rc)
	from := fw.Get(t, rc).Status.Credential.Version

	// The staged credential is watched, so that the nodes are asked from the moment keyroll has it.
	w, err := fw.Clientset.CoreV1().Secrets(rc.Namespace).Watch(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=" + rc.Name + "-keyroll"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	fw.RotateNow(t, rc)
	var user, pass string
	for ev := range w.ResultChan() {
		if s, ok := ev.Object.(*corev1.Secret); ok && string(s.Data["username"]) != oldUser && len(s.Data["username"]) > 0 {
			user, pass = string(s.Data["username"]), string(s.Data["password"])
			break
		}
	}
	if user == "" {
		t.Fatal("the watch of the staged credential ended without a new one")
	}
	nodes := firstAccepted(t, pods, user, pass, time.Minute)
	framework.Eventually(t, 3*time.Minute, func() string { return rotated(t, rc, from) })
	var consumerTimes map[types.UID]time.Time
	framework.Eventually(t, 10*time.Second, func() string {
		if consumerTimes = app.FirstSeenWith(user); len(consumerTimes) < 2 {
			return fmt.Sprintf("%d consumer pods seen on the new credential", len(consumerTimes))
		}
		return ""
	})

	var lastNode time.Time
	for name, at := range nodes {
		t.Logf("node %s first accepted %s at %s", name, user, at.Format(time.StampMicro))
		if at.After(lastNode) {
			lastNode = at
		}
	}
	for uid, at := range consumerTimes {
		t.Logf("consumer pod %s first ran on it at %s (%s after the last node)", uid, at.Format(time.StampMicro), at.Sub(lastNode))
		if !at.After(lastNode) {
			t.Errorf("consumer pod %s had the new credential at %s, before the last node accepted it at %s", uid, at, lastNode)
		}
	}
	if problems := checkPublished(); len(problems) > 0 {
		t.Errorf("%s", strings.Join(problems, "; "))
	}
	if _, failed, errs := app.Totals(); failed != 0 {
		t.Errorf("%d consumer commands failed: %v", failed, errs)
	}
}

// Once the consumers run on the new credential, the old user is removed from every node live:
// it fails to log in on each within seconds of its lease's revocation, not after a kubelet sync.
func TestRetiredUserIsGoneFromEveryNode(t *testing.T) {
	ns := fw.Namespace(t, "retire")
	vc := fw.VaultConnection(t, "vault-retire", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("app"))
	cur := fw.WaitReady(t, rc, 3*time.Minute)
	pods := fw.RedisPods(t, rc)
	app := fw.StartConsumers(t, ns, "app", 1, "cache:6379", "cache-credentials")
	oldUser, oldPass, _ := fw.Credentials(rc)
	oldLease := cur.Status.Credential.Lease.LeaseID

	fw.RotateNow(t, rc)
	var revoked time.Time
	gone := map[string]time.Time{}
	framework.Eventually(t, 3*time.Minute, func() string {
		if exists, _ := fw.LeaseExists(oldLease); !exists && revoked.IsZero() {
			revoked = time.Now()
		}
		for _, p := range pods {
			if _, ok := gone[p.Name]; !ok && !accepts(framework.PodAddr(&p), oldUser, oldPass) {
				gone[p.Name] = time.Now()
			}
		}
		if revoked.IsZero() || len(gone) < len(pods) {
			return fmt.Sprintf("lease revoked: %v, nodes without the old user: %v", !revoked.IsZero(), gone)
		}
		return ""
	})
	for name, at := range gone {
		t.Logf("node %s refuses %s %s after the lease was seen revoked", name, oldUser, at.Sub(revoked).Round(time.Millisecond))
		if at.Sub(revoked) > 3*time.Second {
			t.Errorf("node %s still accepted the retired user %s after the revocation", name, at.Sub(revoked))
		}
	}
	if _, failed, errs := app.Totals(); failed != 0 {
		t.Errorf("%d consumer commands failed: %v", failed, errs)
	}
}
