package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/harness"
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

// vaultConnection creates a VaultConnection to address with the operator's Kubernetes auth role,
// for namespace ns, whose orphan-lease sweep revokes orphans older than 10 s, every 10 s.
func vaultConnection(t *testing.T, name, address, ns string, mutate ...func(*v1alpha1.VaultConnection)) {
	t.Helper()
	vc := &v1alpha1.VaultConnection{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VaultConnectionSpec{
			Address:           address,
			Auth:              v1alpha1.VaultAuth{Kubernetes: &v1alpha1.KubernetesAuth{Role: harness.OperatorRole}},
			AllowedNamespaces: []string{ns},
			OrphanLeases: &v1alpha1.OrphanLeases{Action: v1alpha1.OrphanLeasesRevoke,
				GracePeriod: &metav1.Duration{Duration: 10 * time.Second}, Interval: &metav1.Duration{Duration: 10 * time.Second}},
		},
	}
	for _, m := range mutate {
		m(vc)
	}
	if err := k8s.Create(context.Background(), vc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), vc) })
}

func getConnection(t *testing.T, name string) *v1alpha1.VaultConnection {
	t.Helper()
	vc := &v1alpha1.VaultConnection{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, vc); err != nil {
		t.Fatal(err)
	}
	return vc
}

// credPath is the Vault path that issues a role's credentials.
func credPath(role string) string { return "database/creds/" + role }

// redisCluster creates a one-node RedisCluster (Redis 7.0 on the real node) that takes its
// credential from role through connection, with consumer (when not empty) as its consumer.
func redisCluster(t *testing.T, ns, name, connection, role, consumer string, mutate ...func(*v1alpha1.RedisCluster)) *v1alpha1.RedisCluster {
	t.Helper()
	rc := &v1alpha1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RedisClusterSpec{
			Replicas: 1, Version: "7.0",
			Credentials: v1alpha1.CredentialsSpec{
				Source: v1alpha1.SourceVaultLease,
				VaultLease: &v1alpha1.VaultLeaseSource{
					ConnectionRef: v1alpha1.ConnectionReference{Name: connection}, Path: credPath(role),
				},
			},
		},
	}
	if consumer != "" {
		rc.Spec.Rollout.Consumers = []v1alpha1.ConsumerReference{{Kind: "Deployment", Name: consumer}}
	}
	for _, m := range mutate {
		m(rc)
	}
	if err := k8s.Create(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

func get(t *testing.T, rc *v1alpha1.RedisCluster) *v1alpha1.RedisCluster {
	t.Helper()
	out := &v1alpha1.RedisCluster{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitCondition waits until the RedisCluster has a condition with the given status (and reason).
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

// waitSettled waits until the cluster is Ready with no rollout in progress and no superseded
// lease left, on a credential other than notVersion, and returns it.
func waitSettled(t *testing.T, rc *v1alpha1.RedisCluster, notVersion string, timeout time.Duration) *v1alpha1.RedisCluster {
	t.Helper()
	var cur *v1alpha1.RedisCluster
	eventually(t, timeout, func() string {
		cur = get(t, rc)
		c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionReady)
		switch {
		case c == nil || c.Status != metav1.ConditionTrue:
			return fmt.Sprintf("%s: Ready is %+v", rc.Name, c)
		case cur.Status.Credential == nil || cur.Status.Credential.Version == notVersion:
			return fmt.Sprintf("%s: still on credential %s", rc.Name, notVersion)
		case cur.Status.Rollout != nil:
			return fmt.Sprintf("%s: rollout in progress: %+v", rc.Name, cur.Status.Rollout)
		case len(cur.Status.Leases) != 1:
			return fmt.Sprintf("%s: ledger %+v, want the current lease only", rc.Name, cur.Status.Leases)
		}
		return ""
	})
	credentialsUser(t, rc) // its password joins the leak scan
	return cur
}

// ledger lists the lease IDs in a RedisCluster's ledger.
func ledger(rc *v1alpha1.RedisCluster) []string {
	var ids []string
	for _, l := range rc.Status.Leases {
		ids = append(ids, l.LeaseID)
	}
	slices.Sort(ids)
	return ids
}

// rotateNow asks for one rotation.
func rotateNow(t *testing.T, rc *v1alpha1.RedisCluster) {
	t.Helper()
	cur := get(t, rc)
	patch := client.MergeFrom(cur.DeepCopy())
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[v1alpha1.AnnotationRotateNow] = time.Now().UTC().Format(time.RFC3339Nano)
	if err := k8s.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
}

// credentialsUser is the username in the consumers' Secret ("" without one).
func credentialsUser(t *testing.T, rc *v1alpha1.RedisCluster) string {
	t.Helper()
	u, _ := credentialsSecret(t, rc)
	return u
}

// credentialsSecret is the username and password in the consumers' Secret.
func credentialsSecret(t *testing.T, rc *v1alpha1.RedisCluster) (string, string) {
	t.Helper()
	sec := &corev1.Secret{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name + "-credentials"}, sec); err != nil {
		return "", ""
	}
	sawSecret(string(sec.Data["password"]), "the password in "+rc.Namespace+"/"+sec.Name)
	return string(sec.Data["username"]), string(sec.Data["password"])
}

// consumerDeployment creates a stand-in consumer on kwok's fake node, where it is Ready at once.
func consumerDeployment(t *testing.T, ns, name string) client.ObjectKey {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{NodeSelector: map[string]string{testground.NodeLabel: "kwok"},
					Containers: []corev1.Container{{Name: "app", Image: "example/app:1"}}},
			},
		},
	}
	if err := k8s.Create(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	return client.ObjectKeyFromObject(d)
}

// events lists the events about an object as "Reason: note".
func events(t *testing.T, ns, name string) []string {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}

// count is how many of lines contain every one of parts.
func count(lines []string, parts ...string) int {
	n := 0
	for _, l := range lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			n++
		}
	}
	return n
}

// vaultLeases lists, as root, the leases Vault holds under a role's credential path.
func vaultLeases(t *testing.T, role string) []string {
	t.Helper()
	s, err := ground.Vault.Root.Logical().List("sys/leases/lookup/" + credPath(role) + "/")
	if err != nil {
		t.Fatalf("listing the leases of %s as root: %v", role, err)
	}
	var ids []string
	if s != nil {
		keys, _ := s.Data["keys"].([]any)
		for _, k := range keys {
			ids = append(ids, credPath(role)+"/"+fmt.Sprint(k))
		}
	}
	slices.Sort(ids)
	return ids
}

// leaseWatch samples, as root, the leases under a role every 100 ms, so that a row can name the
// leases it saw (a lease revoked within 100 ms of its issue would be missed: auditIssues counts
// them all).
type leaseWatch struct {
	t    *testing.T
	role string
	mu   sync.Mutex
	seen map[string]time.Time
	stop chan struct{}
	done chan struct{}
}

func watchLeases(t *testing.T, role string) *leaseWatch {
	w := &leaseWatch{t: t, role: role, seen: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	w.sample()
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(100 * time.Millisecond):
				w.sample()
			}
		}
	}()
	t.Cleanup(w.end)
	return w
}

func (w *leaseWatch) sample() {
	s, err := ground.Vault.Root.Logical().List("sys/leases/lookup/" + credPath(w.role) + "/")
	if err != nil || s == nil {
		return
	}
	keys, _ := s.Data["keys"].([]any)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range keys {
		id := credPath(w.role) + "/" + fmt.Sprint(k)
		if _, ok := w.seen[id]; !ok {
			w.seen[id] = time.Now()
		}
	}
}

func (w *leaseWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// issued lists every lease seen under the role since the watch began, in the order seen.
func (w *leaseWatch) issued() []string {
	w.sample()
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.seen))
	for id := range w.seen {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int { return w.seen[a].Compare(w.seen[b]) })
	return ids
}

// operatorLog is every line the operators logged so far that contains all of parts.
func operatorLog(parts ...string) int {
	return count(strings.Split(logs.text(), "\n"), parts...)
}

// auditIssues counts, in Vault's audit log, the credentials Vault issued under a role: its
// successful answers to reads of the role's credential path. Unlike sampling, it misses none.
func auditIssues(t *testing.T, role string) int {
	t.Helper()
	b, err := os.ReadFile(auditLog)
	if err != nil {
		t.Fatalf("reading Vault's audit log: %v", err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		var e struct {
			Type    string `json:"type"`
			Error   string `json:"error"`
			Request struct {
				Path      string `json:"path"`
				Operation string `json:"operation"`
			} `json:"request"`
		}
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		if e.Type == "response" && e.Error == "" && e.Request.Operation == "read" && e.Request.Path == credPath(role) {
			n++
		}
	}
	return n
}
