package dataplane

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

// eventually polls check until it returns "" or the timeout passes; the last message explains a failure.
func eventually(t testing.TB, timeout time.Duration, check func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	msg := ""
	for time.Now().Before(deadline) {
		if msg = check(); msg == "" {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("after %s: %s", timeout, msg)
}

// namespace creates the test's namespace; when the test ends, its RedisClusters (their
// StatefulSets and pods go with them), consumer Deployments and pods are deleted, so that the
// real node runs one test's pods at a time (the pods of earlier tests left running, each consumer
// busy, would take the node's CPU from the later ones).
func namespace(t testing.TB, name string) {
	t.Helper()
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, in := context.Background(), client.InNamespace(name)
		for _, obj := range []client.Object{&v1alpha1.RedisCluster{}, &appsv1.Deployment{}, &appsv1.StatefulSet{}, &corev1.Pod{}} {
			if err := k8s.DeleteAllOf(ctx, obj, in, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
				t.Logf("cleaning up namespace %s: %v", name, err)
			}
		}
	})
}

// vaultConnection creates a VaultConnection with Kubernetes auth as the operator's role.
func vaultConnection(t testing.TB, name string, allowed ...string) {
	t.Helper()
	vc := &v1alpha1.VaultConnection{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VaultConnectionSpec{
			Address:           ground.Vault.Addr,
			Auth:              v1alpha1.VaultAuth{Kubernetes: &v1alpha1.KubernetesAuth{Role: harness.OperatorRole}},
			AllowedNamespaces: allowed,
		},
	}
	if err := k8s.Create(context.Background(), vc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), vc) })
}

// redisCluster creates a RedisCluster of Redis 7.0 (the node's image) in VaultLease mode.
func redisCluster(t testing.TB, ns, name, connection, path string, replicas int32, mutate ...func(*v1alpha1.RedisCluster)) *v1alpha1.RedisCluster {
	t.Helper()
	rc := &v1alpha1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RedisClusterSpec{
			Replicas: replicas, Version: "7.0",
			Credentials: v1alpha1.CredentialsSpec{
				Source:     v1alpha1.SourceVaultLease,
				VaultLease: &v1alpha1.VaultLeaseSource{ConnectionRef: v1alpha1.ConnectionReference{Name: connection}, Path: path},
			},
		},
	}
	for _, m := range mutate {
		m(rc)
	}
	if err := k8s.Create(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

// withConsumer lists a Deployment as the cluster's consumer.
func withConsumer(name string) func(*v1alpha1.RedisCluster) {
	return func(rc *v1alpha1.RedisCluster) {
		rc.Spec.Rollout.Consumers = []v1alpha1.ConsumerReference{{Kind: "Deployment", Name: name}}
	}
}

func get(t testing.TB, rc *v1alpha1.RedisCluster) *v1alpha1.RedisCluster {
	t.Helper()
	out := &v1alpha1.RedisCluster{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), out); err != nil {
		t.Fatal(err)
	}
	return out
}

func condition(rc *v1alpha1.RedisCluster, typ string) *metav1.Condition {
	return meta.FindStatusCondition(rc.Status.Conditions, typ)
}

// waitReady waits until the RedisCluster is Ready.
func waitReady(t testing.TB, rc *v1alpha1.RedisCluster, timeout time.Duration) *v1alpha1.RedisCluster {
	t.Helper()
	var cur *v1alpha1.RedisCluster
	eventually(t, timeout, func() string {
		cur = get(t, rc)
		if c := condition(cur, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Sprintf("RedisCluster %s not Ready: %+v", rc.Name, c)
		}
		return ""
	})
	return cur
}

func rotateNow(t testing.TB, rc *v1alpha1.RedisCluster, value string) {
	t.Helper()
	cur := get(t, rc)
	patch := client.MergeFrom(cur.DeepCopy())
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[v1alpha1.AnnotationRotateNow] = value
	if err := k8s.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
}

// rotated says whether a rotation from version from is over: a new credential on every node, the
// consumers rolled out (their pods on the new credential and the old ones gone), nothing
// superseded left in the ledger or on the nodes.
func rotated(t testing.TB, rc *v1alpha1.RedisCluster, from string) string {
	cur := get(t, rc)
	c := cur.Status.Credential
	switch {
	case c == nil || c.Version == from:
		return "no new credential yet"
	case cur.Status.Rollout != nil:
		return fmt.Sprintf("rollout in progress: %+v", cur.Status.Rollout)
	case len(cur.Status.Leases) != 1 || len(cur.Status.RetiringUsers) > 0:
		return fmt.Sprintf("ledger %+v, retiring users %v", cur.Status.Leases, cur.Status.RetiringUsers)
	}
	if u := condition(cur, v1alpha1.ConditionUsersApplied); u == nil || u.Status != metav1.ConditionTrue {
		return fmt.Sprintf("UsersApplied %+v", u)
	}
	for _, ref := range cur.Spec.Rollout.Consumers {
		d := &appsv1.Deployment{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: ref.Name}, d); err != nil {
			return err.Error()
		}
		st := d.Status
		if d.Spec.Template.Annotations[v1alpha1.AnnotationCredentialVersion] != c.Version || st.UpdatedReplicas != *d.Spec.Replicas ||
			st.Replicas != *d.Spec.Replicas || (st.TerminatingReplicas != nil && *st.TerminatingReplicas > 0) {
			return fmt.Sprintf("consumer %s not rolled out: %+v", ref.Name, st)
		}
	}
	return ""
}

// redisPods are the cluster's pods, by name.
func redisPods(t testing.TB, rc *v1alpha1.RedisCluster) []corev1.Pod {
	t.Helper()
	list := &corev1.PodList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(rc.Namespace), client.MatchingLabels{v1alpha1.LabelCluster: rc.Name}); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(list.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return list.Items
}

func podAddr(p corev1.Pod) string { return net.JoinHostPort(p.Status.PodIP, "6379") }

// secretData reads one key of a Secret.
func secretData(t testing.TB, ns, name, key string) string {
	t.Helper()
	s := &corev1.Secret{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
		return ""
	}
	return string(s.Data[key])
}

// adminPassword is keyroll's admin password of a cluster (from the Secret only keyroll reads).
func adminPassword(t testing.TB, rc *v1alpha1.RedisCluster) string {
	t.Helper()
	return secretData(t, rc.Namespace, rc.Name+"-keyroll", "admin-password")
}

// published is the credential in the consumers' Secret.
func published(t testing.TB, rc *v1alpha1.RedisCluster) (user, pass string) {
	t.Helper()
	return secretData(t, rc.Namespace, rc.Name+"-credentials", "username"), secretData(t, rc.Namespace, rc.Name+"-credentials", "password")
}

// accepts says whether the node at addr lets user log in with pass.
func accepts(addr, user, pass string) bool {
	n := redisnode.New(addr, user, pass)
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, err := n.Accepts(ctx, user, pass)
	return err == nil && ok
}

// node is a client of one Redis node as keyroll's admin user.
func node(addr, adminPassword string) *redisnode.Client {
	return redisnode.New(addr, "keyroll-admin", adminPassword)
}

// appClient is a go-redis client of one node as an app user.
func appClient(addr, user, pass string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: pass, Protocol: 2, DisableIdentity: true, PoolSize: 2})
}

// podRun identifies one run of a pod: a restart or a new pod changes it.
type podRun struct {
	uid      types.UID
	restarts int32
}

func runs(pods []corev1.Pod) map[string]podRun {
	out := map[string]podRun{}
	for _, p := range pods {
		r := podRun{uid: p.UID}
		for _, c := range p.Status.ContainerStatuses {
			r.restarts += c.RestartCount
		}
		out[p.Name] = r
	}
	return out
}

// consumers follows the pods of a consumer Deployment: the counters of each running pod (read
// from /stats) and the final counters of each pod that stopped (its termination message), so
// that no command of a replaced pod goes uncounted.
type consumers struct {
	mu    sync.Mutex
	live  map[types.UID]testground.ConsumerStats
	final map[types.UID]testground.ConsumerStats
	ips   map[types.UID]string
	names map[types.UID]string
	// seen records, per pod, when it was first seen with each user.
	seen  map[types.UID]map[string]time.Time
	stop  chan struct{}
	done  sync.WaitGroup
	watch watch.Interface
}

// startConsumers creates a Deployment of consumer pods against redisAddr with the Secret's
// credential, waits until each runs commands, and follows them until the test ends.
func startConsumers(t testing.TB, ns, name string, replicas int32, redisAddr, secret string) *consumers {
	t.Helper()
	if err := k8s.Create(context.Background(), testground.ConsumerDeployment(ns, name, replicas, redisAddr, secret)); err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		t.Fatal(err)
	}
	c := &consumers{live: map[types.UID]testground.ConsumerStats{}, final: map[types.UID]testground.ConsumerStats{},
		ips: map[types.UID]string{}, names: map[types.UID]string{}, seen: map[types.UID]map[string]time.Time{}, stop: make(chan struct{}), watch: w}
	c.done.Add(2)
	go func() {
		defer c.done.Done()
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Error {
				c.observe(p)
			}
		}
	}()
	go func() {
		defer c.done.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
				c.poll()
			}
		}
	}()
	t.Cleanup(c.halt)
	eventually(t, 2*time.Minute, func() string {
		c.mu.Lock()
		defer c.mu.Unlock()
		running := 0
		for uid, s := range c.live {
			if _, stopped := c.final[uid]; !stopped && s.OK >= 10 {
				running++
			}
		}
		if running < int(replicas) {
			return fmt.Sprintf("%d of %d consumer pods run commands: %+v", running, replicas, c.live)
		}
		return ""
	})
	return c
}

// halt stops following the pods (the counters stay as last read).
func (c *consumers) halt() {
	c.watch.Stop()
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.done.Wait()
}

func (c *consumers) observe(p *corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.names[p.UID] = p.Name
	if p.Status.PodIP != "" {
		c.ips[p.UID] = p.Status.PodIP
	}
	if s, ok := testground.FinalConsumerStats(p); ok {
		c.final[p.UID] = s
	}
}

// poll reads /stats of every pod that has not stopped.
func (c *consumers) poll() {
	c.mu.Lock()
	ips := map[types.UID]string{}
	for uid, ip := range c.ips {
		if _, stopped := c.final[uid]; !stopped {
			ips[uid] = ip
		}
	}
	c.mu.Unlock()
	for uid, ip := range ips {
		s, err := testground.ReadConsumerStats(ip)
		if err != nil {
			continue
		}
		now := time.Now()
		c.mu.Lock()
		c.live[uid] = s
		if c.seen[uid] == nil {
			c.seen[uid] = map[string]time.Time{}
		}
		if _, ok := c.seen[uid][s.User]; !ok && s.User != "" {
			c.seen[uid][s.User] = now
		}
		c.mu.Unlock()
	}
}

// totals are the commands of every pod seen, final counters where a pod stopped, and a
// description (describeFailures) of each pod that had failures.
func (c *consumers) totals() (ok, failed int64, failures []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	add := func(uid types.UID, s testground.ConsumerStats) {
		ok, failed = ok+s.OK, failed+s.Failed
		if s.Failed > 0 {
			failures = append(failures, describeFailures(c.names[uid], s))
		}
	}
	for uid, s := range c.live {
		if f, stopped := c.final[uid]; stopped {
			s = f
		}
		add(uid, s)
	}
	for uid, f := range c.final {
		if _, counted := c.live[uid]; !counted { // stopped before its first poll
			add(uid, f)
		}
	}
	return ok, failed, failures
}

// describeFailures names a consumer pod's failed commands: each of the first the pod kept (when,
// which, as whom, why), and the last.
func describeFailures(pod string, s testground.ConsumerStats) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s: %d failed:", pod, s.Failed)
	for _, f := range s.Failures {
		fmt.Fprintf(&b, " [%s %s as %s: %s]", f.At, f.Op, f.User, f.Error)
	}
	fmt.Fprintf(&b, " last: %s (%s)", s.LastError, s.LastFailure)
	return b.String()
}

// stats are the counters of every pod seen, final ones where a pod stopped.
func (c *consumers) stats() []testground.ConsumerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []testground.ConsumerStats
	for uid, s := range c.live {
		if f, stopped := c.final[uid]; stopped {
			s = f
		}
		out = append(out, s)
	}
	for uid, f := range c.final {
		if _, counted := c.live[uid]; !counted {
			out = append(out, f)
		}
	}
	return out
}

// firstSeenWith is, per consumer pod, when it was first seen running with user.
func (c *consumers) firstSeenWith(user string) map[types.UID]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[types.UID]time.Time{}
	for uid, users := range c.seen {
		if at, ok := users[user]; ok {
			out[uid] = at
		}
	}
	return out
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
