package integration

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/testground"
)

// eventually polls check until it returns "" or the timeout passes; the last message explains a failure.
func eventually(t *testing.T, timeout time.Duration, check func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	msg := ""
	for time.Now().Before(deadline) {
		if msg = check(); msg == "" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("after %s: %s", timeout, msg)
}

func namespace(t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
}

// vaultConnection creates a VaultConnection with Kubernetes auth as the operator's role.
func vaultConnection(t *testing.T, name, address string, allowed ...string) *v1alpha1.VaultConnection {
	t.Helper()
	vc := &v1alpha1.VaultConnection{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VaultConnectionSpec{
			Address:           address,
			Auth:              v1alpha1.VaultAuth{Kubernetes: &v1alpha1.KubernetesAuth{Role: operatorRole}},
			AllowedNamespaces: allowed,
		},
	}
	if err := k8s.Create(context.Background(), vc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), vc) })
	return vc
}

// redisCluster creates a RedisCluster in direct (VaultLease) mode with one Redis node (mutate
// asks for more where their number matters), of Redis 7.0, the image the real node has. It is
// deleted when the test ends, so that its pods do not run on through the rest of the package.
func redisCluster(t *testing.T, ns, name, connection, path string, mutate ...func(*v1alpha1.RedisCluster)) *v1alpha1.RedisCluster {
	t.Helper()
	rc := &v1alpha1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RedisClusterSpec{
			Replicas: 1, Version: redisVersion,
			Credentials: v1alpha1.CredentialsSpec{
				Source: v1alpha1.SourceVaultLease,
				VaultLease: &v1alpha1.VaultLeaseSource{
					ConnectionRef: v1alpha1.ConnectionReference{Name: connection}, Path: path,
				},
			},
		},
	}
	for _, m := range mutate {
		m(rc)
	}
	createCluster(t, rc)
	return rc
}

// redisVersion is the Redis version of every RedisCluster here: the real node has only the image
// docker.io/library/redis:7.0 (testground.RedisImage).
const redisVersion = "7.0"

// createCluster creates a RedisCluster and deletes it when the test ends.
func createCluster(t *testing.T, rc *v1alpha1.RedisCluster) {
	t.Helper()
	if err := k8s.Create(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), rc) })
}

// replicas sets the number of Redis nodes.
func replicas(n int32) func(*v1alpha1.RedisCluster) {
	return func(rc *v1alpha1.RedisCluster) { rc.Spec.Replicas = n }
}

func get(t *testing.T, rc *v1alpha1.RedisCluster) *v1alpha1.RedisCluster {
	t.Helper()
	out := &v1alpha1.RedisCluster{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitCondition waits until the RedisCluster has a condition with the given status and reason.
func waitCondition(t *testing.T, rc *v1alpha1.RedisCluster, condType string, status metav1.ConditionStatus, reason string, timeout time.Duration) *v1alpha1.RedisCluster {
	t.Helper()
	var cur *v1alpha1.RedisCluster
	eventually(t, timeout, func() string {
		cur = get(t, rc)
		c := meta.FindStatusCondition(cur.Status.Conditions, condType)
		if c == nil || c.Status != status || (reason != "" && c.Reason != reason) {
			return fmt.Sprintf("%s: condition %s is %+v, want %s/%s", rc.Name, condType, c, status, reason)
		}
		return ""
	})
	return cur
}

// waitReady waits until the RedisCluster is Ready: a live credential that every Redis node
// accepts, and every Redis pod Ready. Only then is the consumers' Secret written.
func waitReady(t *testing.T, rc *v1alpha1.RedisCluster, timeout time.Duration) *v1alpha1.RedisCluster {
	t.Helper()
	cur := waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", timeout)
	if c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionUsersApplied); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready while UsersApplied is %+v", c)
	}
	return cur
}

// credentials reads the consumers' Secret.
func credentials(t *testing.T, rc *v1alpha1.RedisCluster) (user, pass string, ok bool) {
	t.Helper()
	sec := &corev1.Secret{}
	name := rc.Name + "-credentials"
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: name}, sec); err != nil {
		return "", "", false
	}
	return string(sec.Data["username"]), string(sec.Data["password"]), true
}

// authenticates says whether a credential works against the Redis that Vault manages (Vault
// deletes the user there when it revokes the lease).
func authenticates(user, pass string) bool {
	who, err := ground.Redis.WhoAmI(user, pass)
	return err == nil && who == user
}

// redisPods lists the Redis pods of a cluster, by name.
func redisPods(t *testing.T, rc *v1alpha1.RedisCluster) []corev1.Pod {
	t.Helper()
	pods, err := listRedisPods(rc)
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

func listRedisPods(rc *v1alpha1.RedisCluster) ([]corev1.Pod, error) {
	list := &corev1.PodList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(rc.Namespace), client.MatchingLabels{v1alpha1.LabelCluster: rc.Name}); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return list.Items, nil
}

// redisAddr is where a Redis pod listens: its pod IP, which the host reaches directly.
func redisAddr(p *corev1.Pod) string { return net.JoinHostPort(p.Status.PodIP, "6379") }

// onEveryPod checks a credential on each of the cluster's Redis pods (it must find as many as
// spec.replicas): with accept, it must log in as user on every one; without, be refused on every
// one. It returns "" or what went otherwise.
func onEveryPod(t *testing.T, rc *v1alpha1.RedisCluster, user, pass string, accept bool) string {
	t.Helper()
	msg, err := checkOnEveryPod(rc, user, pass, accept)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// checkOnEveryPod is onEveryPod for a goroutine other than the test's.
func checkOnEveryPod(rc *v1alpha1.RedisCluster, user, pass string, accept bool) (string, error) {
	pods, err := listRedisPods(rc)
	if err != nil {
		return "", err
	}
	if len(pods) != int(rc.Spec.Replicas) {
		return fmt.Sprintf("%d Redis pods, want %d", len(pods), rc.Spec.Replicas), nil
	}
	var wrong []string
	for i := range pods {
		p := &pods[i]
		who, err := testground.RedisWhoAmI(redisAddr(p), user, pass)
		if ok := err == nil && who == user; ok != accept {
			wrong = append(wrong, fmt.Sprintf("%s (%s): %q, %v", p.Name, p.Status.PodIP, who, err))
		}
	}
	switch {
	case len(wrong) == 0:
		return "", nil
	case accept:
		return fmt.Sprintf("user %s does not log in on %v", user, wrong), nil
	default:
		return fmt.Sprintf("user %s still logs in on %v", user, wrong), nil
	}
}

// internalPasswords are the passwords of keyroll's own users of a cluster: the admin's from the
// Secret only keyroll reads, the replication and probe users' from the ACL Secret the pods mount.
func internalPasswords(t *testing.T, rc *v1alpha1.RedisCluster) map[string]string {
	t.Helper()
	out := map[string]string{}
	for secret, keys := range map[string][]string{rc.Name + "-keyroll": {"admin-password"}, rc.Name + "-acl": {"replication-password", "probe-password"}} {
		sec := &corev1.Secret{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: secret}, sec); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if len(sec.Data[k]) == 0 {
				t.Fatalf("Secret %s has no %s", secret, k)
			}
			out[k] = string(sec.Data[k])
		}
	}
	return out
}

// eventReasons lists the reasons of the events about an object, once per occurrence: the event
// recorder folds an event repeated on the same version of the object into a series, sent as one
// Event with series.count 2 (later repeats of a series reach the API server only minutes later).
func eventReasons(t *testing.T, ns, name string) []string {
	t.Helper()
	return reasonsOf(events(t, ns, name))
}

// hasEvent says whether an event of reason (any, when empty) about an object turns up within 10
// s: the recorder sends events asynchronously, after the status write that carries their change.
func hasEvent(t *testing.T, ns, name, reason string) bool {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		reasons := eventReasons(t, ns, name)
		if (reason == "" && len(reasons) > 0) || (reason != "" && slices.Contains(reasons, reason)) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// warningReasons lists the reasons of the Warning events about an object, as eventReasons does.
func warningReasons(t *testing.T, ns, name string) []string {
	t.Helper()
	var warnings []eventsv1.Event
	for _, e := range events(t, ns, name) {
		if e.Type == corev1.EventTypeWarning {
			warnings = append(warnings, e)
		}
	}
	return reasonsOf(warnings)
}

// warningNotes lists the Warning events about an object with their notes, to explain a failure.
func warningNotes(t *testing.T, ns, name string) []string {
	t.Helper()
	var out []string
	for _, e := range events(t, ns, name) {
		if e.Type == corev1.EventTypeWarning {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}

func reasonsOf(list []eventsv1.Event) []string {
	var out []string
	for _, e := range list {
		n := 1
		if e.Series != nil {
			n = int(e.Series.Count)
		}
		for range n {
			out = append(out, e.Reason)
		}
	}
	return out
}

// events lists the events about a RedisCluster (not those about its objects of the same name,
// such as its client Service, about which the API server may warn on its own).
func events(t *testing.T, ns, name string) []eventsv1.Event {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Regarding.Kind == "RedisCluster" {
			out = append(out, e)
		}
	}
	return out
}

// eventsNaming lists the reasons of the events about a RedisCluster whose notes name any of
// words (a credential version, a user, a lease), each occurrence counted: the events of one
// rotation, whatever the series of earlier events did meanwhile.
func eventsNaming(t *testing.T, ns, name string, words ...string) []string {
	t.Helper()
	var out []eventsv1.Event
	for _, e := range events(t, ns, name) {
		if slices.ContainsFunc(words, func(w string) bool { return strings.Contains(e.Note, w) }) {
			out = append(out, e)
		}
	}
	return reasonsOf(out)
}

// newReasons lists the reasons in after beyond those already in before (each occurrence counted).
func newReasons(before, after []string) []string {
	left := slices.Clone(before)
	var out []string
	for _, r := range after {
		if i := slices.Index(left, r); i >= 0 {
			left = slices.Delete(left, i, i+1)
			continue
		}
		out = append(out, r)
	}
	return out
}

// leaseExists asks Vault (as root) whether a lease exists, and when it expires.
func leaseExists(t *testing.T, id string) (bool, time.Time) {
	t.Helper()
	return ground.Vault.LeaseExpiry(id)
}
