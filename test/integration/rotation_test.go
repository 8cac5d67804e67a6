package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/framework"
)

// podRecorder follows the Redis pods of a cluster through a watch and records each restart (the
// moment a pod is marked for deletion) with the state of the other pods at that moment.
type podRecorder struct {
	mu       sync.Mutex
	pods     map[string]*corev1.Pod
	restarts []restart
}

type restart struct {
	pod            string
	version        string // the credential version the pod ran
	detail         string // the watch event that marked it
	othersReady    bool
	othersNotReady []string
}

func recordPods(t *testing.T, ns, cluster string) *podRecorder {
	t.Helper()
	w, err := fw.Clientset.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelCluster + "=" + cluster})
	if err != nil {
		t.Fatal(err)
	}
	rec := &podRecorder{pods: map[string]*corev1.Pod{}}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			rec.observe(ev.Type, p)
		}
	}()
	t.Cleanup(w.Stop)
	return rec
}

func (r *podRecorder) observe(typ watch.EventType, p *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.pods[p.Name]
	marked := p.DeletionTimestamp != nil && (old == nil || old.UID != p.UID || old.DeletionTimestamp == nil)
	if typ == watch.Deleted && old != nil && old.UID == p.UID && old.DeletionTimestamp == nil {
		marked = true
	}
	if marked {
		oldState := "none"
		if old != nil {
			oldState = fmt.Sprintf("uid %s deleting %v", old.UID, old.DeletionTimestamp != nil)
		}
		rs := restart{pod: p.Name, version: p.Annotations[v1alpha1.AnnotationCredentialVersion], othersReady: true, detail: fmt.Sprintf("%s %s uid %s rv %s (before: %s)", typ, p.Name, p.UID, p.ResourceVersion, oldState)}
		for name, o := range r.pods {
			if name != p.Name && !isReady(o) {
				rs.othersReady = false
				rs.othersNotReady = append(rs.othersNotReady, name)
			}
		}
		r.restarts = append(r.restarts, rs)
	}
	if typ == watch.Deleted {
		if old != nil && old.UID == p.UID {
			delete(r.pods, p.Name)
		}
		return
	}
	r.pods[p.Name] = p
}

func (r *podRecorder) snapshot() ([]restart, map[string]*corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pods := map[string]*corev1.Pod{}
	for k, v := range r.pods {
		pods[k] = v
	}
	return slices.Clone(r.restarts), pods
}

// checkOneAtATime checks that the pods on a superseded credential were restarted in the order
// given (replicas first, the primary last), each while every other pod was Ready. keyroll only
// ever restarts pods that do not run the new version; a pod deleted while it already ran it was
// deleted by someone else (logged, not counted).
func (r *podRecorder) checkOneAtATime(t *testing.T, newVersion string, order ...string) {
	t.Helper()
	restarts, _ := r.snapshot()
	var got, details []string
	for _, rs := range restarts {
		details = append(details, rs.detail)
		if rs.version == newVersion {
			t.Logf("pod %s was deleted while it already ran the new credential, not by keyroll: %s", rs.pod, rs.detail)
			continue
		}
		got = append(got, rs.pod)
		if !rs.othersReady {
			t.Errorf("pod %s was restarted while %v were not Ready", rs.pod, rs.othersNotReady)
		}
	}
	if !slices.Equal(got, order) {
		t.Errorf("restart order %v, want %v (replicas first, the primary last); seen as %v", got, order, details)
	}
}

// isReady is framework.PodReady for a pod that is not being deleted either: a pod marked for
// deletion still reports Ready until its kubelet stops it.
func isReady(p *corev1.Pod) bool {
	return framework.PodReady(p) && p.DeletionTimestamp == nil
}

// podRuns describes each Redis pod's run (uid, restarts, container start), to tell whether any
// restarted.
func podRuns(t *testing.T, rc *v1alpha1.RedisCluster) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range fw.RedisPods(t, rc) {
		run := "uid " + string(p.UID)
		for _, c := range p.Status.ContainerStatuses {
			run += fmt.Sprintf(", container %s restarts %d", c.Name, c.RestartCount)
			if c.State.Running != nil {
				run += " started " + c.State.Running.StartedAt.String()
			}
		}
		out[p.Name] = run
	}
	return out
}

// consumerVersion is the credential version on a consumer Deployment's pod template.
func consumerVersion(t *testing.T, ns, name string) string {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template.Annotations[v1alpha1.AnnotationCredentialVersion]
}

// watchPublication watches the consumers' Secret of rc and its consumer Deployment: the first
// time each shows a credential version other than oldVersion, the credential in the Secret must
// already log in on every Redis node. The returned function lists what went otherwise (a
// publication not seen included).
func watchPublication(t *testing.T, rc *v1alpha1.RedisCluster, consumer, oldVersion string) func() []string {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var problems []string
	seen := map[string]bool{}
	check := func(what, version string) {
		mu.Lock()
		first := !seen[what]
		seen[what] = true
		mu.Unlock()
		if !first {
			return
		}
		sec := &corev1.Secret{}
		msg := ""
		if err := fw.Client.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name + "-credentials"}, sec); err != nil {
			msg = err.Error()
		} else if v := sec.Annotations[v1alpha1.AnnotationCredentialVersion]; v != version {
			msg = fmt.Sprintf("the consumers' Secret holds version %s", v)
		} else {
			msg = fw.OnEveryPod(rc, string(sec.Data["username"]), string(sec.Data["password"]), true)
		}
		if msg != "" {
			mu.Lock()
			problems = append(problems, fmt.Sprintf("when %s got credential %s: %s", what, version, msg))
			mu.Unlock()
		}
	}
	sw, err := fw.Clientset.CoreV1().Secrets(rc.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + rc.Name + "-credentials"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Stop)
	dw, err := fw.Clientset.AppsV1().Deployments(rc.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + consumer})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dw.Stop)
	go func() {
		for ev := range sw.ResultChan() {
			if s, ok := ev.Object.(*corev1.Secret); ok {
				if v := s.Annotations[v1alpha1.AnnotationCredentialVersion]; v != "" && v != oldVersion {
					check("the consumers' Secret", v)
				}
			}
		}
	}()
	go func() {
		for ev := range dw.ResultChan() {
			if d, ok := ev.Object.(*appsv1.Deployment); ok {
				if v := d.Spec.Template.Annotations[v1alpha1.AnnotationCredentialVersion]; v != "" && v != oldVersion {
					check("the consumer", v)
				}
			}
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(problems)
		for _, what := range []string{"the consumers' Secret", "the consumer"} {
			if !seen[what] {
				out = append(out, what+" was never seen on a new credential")
			}
		}
		return out
	}
}

// checkRetired checks that a rotation away from the old credential is complete: the consumer and
// the consumers' Secret have the current one, which works in Vault's Redis and on every Redis
// node, while the old user logs in nowhere and its lease is gone from Vault.
func checkRetired(t *testing.T, rc *v1alpha1.RedisCluster, consumer, oldUser, oldPass, oldLease string) *v1alpha1.RedisCluster {
	t.Helper()
	cur := fw.Get(t, rc)
	if v := consumerVersion(t, rc.Namespace, consumer); v != cur.Status.Credential.Version {
		t.Errorf("consumer template annotation %q, want %q", v, cur.Status.Credential.Version)
	}
	if fw.Authenticates(oldUser, oldPass) {
		t.Error("the old credential still works in Vault's Redis after the rollout")
	}
	if msg := fw.OnEveryPod(rc, oldUser, oldPass, false); msg != "" {
		t.Errorf("after the rollout: %s", msg)
	}
	if len(cur.Status.RetiringUsers) > 0 {
		t.Errorf("status.retiringUsers %v after the rollout", cur.Status.RetiringUsers)
	}
	if exists, _ := fw.LeaseExists(oldLease); exists {
		t.Error("the superseded lease is still live in Vault")
	}
	newUser, newPass, _ := fw.Credentials(rc)
	if !fw.Authenticates(newUser, newPass) || newUser == oldUser {
		t.Error("the new credential does not work in Vault's Redis")
	}
	if msg := fw.OnEveryPod(rc, newUser, newPass, true); msg != "" {
		t.Error(msg)
	}
	return cur
}

// waitRolledOut waits until rc's rollout is over and its ledger holds only the current lease,
// which is not oldLease.
func waitRolledOut(t *testing.T, rc *v1alpha1.RedisCluster, oldLease string, timeout time.Duration) *v1alpha1.RedisCluster {
	t.Helper()
	var cur *v1alpha1.RedisCluster
	framework.Eventually(t, timeout, func() string {
		cur = fw.Get(t, rc)
		if cur.Status.Rollout != nil || len(cur.Status.Leases) != 1 || cur.Status.Leases[0].LeaseID == oldLease {
			return fmt.Sprintf("rollout %+v, ledger %+v", cur.Status.Rollout, cur.Status.Leases)
		}
		return ""
	})
	return cur
}

// A rotation in Live mode (the default) changes users, not pods: the new credential's user goes
// onto every Redis node, and only once every node accepts it is it published in the consumers'
// Secret and the consumer restarted; the old credential works everywhere until then; after the
// rollout the old user is gone from every node and its lease is revoked. No Redis pod restarts,
// and each step happens once.
func TestLiveRotationMovesUsersNotPodsAndConsumersOnlyOnceEveryNodeAcceptsThenRetiresTheOld(t *testing.T) {
	ns := fw.Namespace(t, "rotate")
	vc := fw.VaultConnection(t, "vault-rotate", framework.Allow(ns))
	fw.StandInConsumer(t, ns, "orders-api", 2)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("orders-api"))
	cur := fw.WaitReady(t, rc, 90*time.Second)
	oldLease, oldVersion := cur.Status.Credential.LeaseID, cur.Status.Credential.Version
	oldUser, oldPass, _ := fw.Credentials(rc)
	if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); msg != "" {
		t.Fatal(msg)
	}
	runs := podRuns(t, rc)
	sts := &appsv1.StatefulSet{}
	if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), sts); err != nil {
		t.Fatal(err)
	}
	if v, ok := sts.Spec.Template.Annotations[v1alpha1.AnnotationCredentialVersion]; ok {
		t.Errorf("in Live mode the StatefulSet's template names credential %s", v)
	}
	warningsBefore := framework.Reasons(framework.Warnings(fw.ClusterEvents(t, ns, "orders")))
	published := watchPublication(t, rc, "orders-api", oldVersion)

	start := time.Now()
	ack := fw.RotateNow(t, rc)
	// The old credential keeps working while the rollout runs: as long as the consumer (the last
	// step before the old user is removed) has not been given the new version, it must log in in
	// Vault's Redis and on every Redis node. The consumer is read before the credential is tried,
	// so that a retirement in between cannot pass for a failure.
	framework.Eventually(t, 120*time.Second, func() string {
		if v := consumerVersion(t, ns, "orders-api"); v == "" || v == oldVersion {
			if !fw.Authenticates(oldUser, oldPass) {
				t.Fatal("the old credential stopped working in Vault's Redis before the consumer was restarted")
			}
			if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); msg != "" {
				t.Fatalf("before the consumer was restarted: %s", msg)
			}
		}
		cur = fw.Get(t, rc)
		if cur.Status.Credential.Version == oldVersion || cur.Status.Rollout != nil {
			return fmt.Sprintf("rollout not finished: %+v", cur.Status.Rollout)
		}
		if hasLeaseID(cur, oldLease) {
			return "the old lease is still in the ledger"
		}
		return ""
	})
	t.Logf("rotation rolled out and old lease revoked %s after rotate-now", time.Since(start).Round(time.Millisecond))

	for _, p := range published() {
		t.Error(p)
	}
	cur = checkRetired(t, rc, "orders-api", oldUser, oldPass, oldLease)
	if after := podRuns(t, rc); !maps.Equal(after, runs) {
		t.Errorf("a Redis pod restarted in a Live rotation:\nbefore %v\nafter  %v", runs, after)
	}
	if cur.Status.RotateNowAcknowledged != ack {
		t.Errorf("rotate-now not acknowledged: %q, want %q", cur.Status.RotateNowAcknowledged, ack)
	}
	// Each step once: a reconcile that read a lagging cache must not apply, finish, retire or
	// revoke a second time. The rotation's events are those that name its credential, the
	// retirement of the old user or the lease it revoked (an event of the cluster's creation
	// repeated in a series may reach the API server only now, and names the old user too).
	got := framework.Reasons(framework.Naming(fw.ClusterEvents(t, ns, "orders"), cur.Status.Credential.Version, "Users "+oldUser+" removed", oldLease))
	for _, once := range []string{v1alpha1.EventCredentialsIssued, v1alpha1.EventRotationStarted, v1alpha1.EventUsersApplied,
		v1alpha1.EventConsumerRestarted, v1alpha1.EventRotationFinished, v1alpha1.EventUsersRetired, v1alpha1.EventLeaseRevoked} {
		if n := countOf(got, once); n != 1 {
			t.Errorf("%d %s events for one rotation, want 1 (the rotation's events: %v)", n, once, got)
		}
	}
	if countOf(got, v1alpha1.EventPodRestarted) != 0 {
		t.Errorf("a Live rotation recorded PodRestarted: %v", got)
	}
	warnings := framework.Warnings(fw.ClusterEvents(t, ns, "orders"))
	if w := framework.NewReasons(warningsBefore, framework.Reasons(warnings)); len(w) > 0 {
		t.Errorf("warnings during a healthy rotation: %v (every warning: %v)", w, framework.Notes(warnings))
	}
}

// With rollout.redisPods Restart a rotation also restarts the Redis pods: after every node accepts
// the new user, one pod at a time, replicas first and the primary last, each only while every
// other pod is Ready; then the consumer; then the old user leaves every node and its lease is
// revoked.
func TestRestartRotationRestartsRedisPodsOneAtATimeThenConsumersAndRevokesTheOldLeaseLast(t *testing.T) {
	ns := fw.Namespace(t, "rotate-restart")
	vc := fw.VaultConnection(t, "vault-rotate-restart", framework.Allow(ns))
	fw.StandInConsumer(t, ns, "orders-api", 2)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("orders-api"), func(rc *v1alpha1.RedisCluster) {
		rc.Spec.Rollout.RedisPods = v1alpha1.RedisPodsRestart
	})
	cur := fw.WaitReady(t, rc, 90*time.Second)
	oldLease, oldVersion := cur.Status.Credential.LeaseID, cur.Status.Credential.Version
	oldUser, oldPass, _ := fw.Credentials(rc)
	pods := recordPods(t, ns, "orders")
	events := fw.ClusterEvents(t, ns, "orders")
	before, warningsBefore := framework.Reasons(events), framework.Reasons(framework.Warnings(events))
	// The first credential replaced none: the pods, which started before it, got its user live
	// and are not restarted for it.
	for _, r := range []string{v1alpha1.EventRotationStarted, v1alpha1.EventPodRestarted} {
		if slices.Contains(before, r) {
			t.Errorf("a %s event before any rotation: %v", r, before)
		}
	}
	published := watchPublication(t, rc, "orders-api", oldVersion)

	// Watch the consumer: when it gets the new version, every Redis pod must already run it.
	var consumerEarly []string
	var consumerMu sync.Mutex
	dw, err := fw.Clientset.AppsV1().Deployments(ns).Watch(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=orders-api"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dw.Stop)
	go func() {
		seen := false
		for ev := range dw.ResultChan() {
			d, ok := ev.Object.(*appsv1.Deployment)
			v := ""
			if ok {
				v = d.Spec.Template.Annotations[v1alpha1.AnnotationCredentialVersion]
			}
			if seen || v == "" || v == oldVersion {
				continue
			}
			seen = true
			_, now := pods.snapshot()
			consumerMu.Lock()
			for name, p := range now {
				if p.Annotations[v1alpha1.AnnotationCredentialVersion] != v || !isReady(p) {
					consumerEarly = append(consumerEarly, name)
				}
			}
			if len(now) != 3 {
				consumerEarly = append(consumerEarly, fmt.Sprintf("%d pods", len(now)))
			}
			consumerMu.Unlock()
		}
	}()

	start := time.Now()
	fw.RotateNow(t, rc)
	framework.Eventually(t, 180*time.Second, func() string {
		if v := consumerVersion(t, ns, "orders-api"); (v == "" || v == oldVersion) && !fw.Authenticates(oldUser, oldPass) {
			t.Fatal("the old credential stopped working before the consumer was restarted")
		}
		cur = fw.Get(t, rc)
		if cur.Status.Credential.Version == oldVersion || cur.Status.Rollout != nil {
			return fmt.Sprintf("rollout not finished: %+v", cur.Status.Rollout)
		}
		if hasLeaseID(cur, oldLease) {
			return "the old lease is still in the ledger"
		}
		return ""
	})
	t.Logf("rotation with pod restarts rolled out and old lease revoked %s after rotate-now", time.Since(start).Round(time.Millisecond))

	pods.checkOneAtATime(t, cur.Status.Credential.Version, "orders-2", "orders-1", "orders-0")
	consumerMu.Lock()
	if len(consumerEarly) > 0 {
		t.Errorf("the consumer got the new version before every Redis pod was Ready on it: %v", consumerEarly)
	}
	consumerMu.Unlock()
	for _, p := range published() {
		t.Error(p)
	}
	checkRetired(t, rc, "orders-api", oldUser, oldPass, oldLease)
	events = fw.ClusterEvents(t, ns, "orders")
	got := framework.NewReasons(before, framework.Reasons(events))
	for _, want := range []string{v1alpha1.EventPodRestarted, v1alpha1.EventUsersApplied} {
		if !slices.Contains(got, want) {
			t.Errorf("no %s event (the rotation's events: %v)", want, got)
		}
	}
	for _, once := range []string{v1alpha1.EventRotationStarted, v1alpha1.EventConsumerRestarted, v1alpha1.EventRotationFinished,
		v1alpha1.EventUsersRetired, v1alpha1.EventLeaseRevoked} {
		if n := countOf(got, once); n != 1 {
			t.Errorf("%d %s events for one rotation, want 1 (the rotation's events: %v)", n, once, got)
		}
	}
	if w := framework.NewReasons(warningsBefore, framework.Reasons(framework.Warnings(events))); len(w) > 0 {
		t.Errorf("warnings during a healthy rotation: %v (every warning: %v)", w, framework.Notes(framework.Warnings(events)))
	}
}

// A Redis pod that does not come back from its restart (rollout.redisPods Restart; the real
// node's kubelet is held, so the pod stays Terminating and still reported Ready) stops the
// rollout: once it has not run Redis for rollout.readinessTimeout after its restart, and not
// before (the pod ran for longer than that before), the cluster is Degraded with a warning event;
// no further pod and no consumer is touched, and the old credential and lease stay. Once the
// kubelet goes on, the rollout resumes and completes.
func TestStalledRolloutTouchesNoFurtherPodAndResumesWhenReady(t *testing.T) {
	ns := fw.Namespace(t, "stall")
	vc := fw.VaultConnection(t, "vault-stall", framework.Allow(ns))
	fw.StandInConsumer(t, ns, "orders-api", 2)
	const timeout = 10 * time.Second
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("orders-api"), func(rc *v1alpha1.RedisCluster) {
		rc.Spec.Rollout.RedisPods = v1alpha1.RedisPodsRestart
		rc.Spec.Rollout.ReadinessTimeout = &metav1.Duration{Duration: timeout}
	})
	cur := fw.WaitReady(t, rc, 90*time.Second)
	oldLease, oldVersion := cur.Status.Credential.LeaseID, cur.Status.Credential.Version
	oldUser, oldPass, _ := fw.Credentials(rc)
	before := map[string]string{}
	for _, name := range []string{"orders-0", "orders-1"} {
		p := &corev1.Pod{}
		if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
			t.Fatal(err)
		}
		before[name] = string(p.UID)
	}
	// Pods that ran for longer than readinessTimeout before their restart, as pods usually have:
	// their restart must not be timed from their creation.
	oldest := &corev1.Pod{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "orders-2"}, oldest); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(oldest.CreationTimestamp.Add(2 * timeout)))

	resume := pauseRealKubelet(t)
	fw.RotateNow(t, rc)
	var restarted time.Time
	framework.Eventually(t, 30*time.Second, func() string {
		ro := fw.Get(t, rc).Status.Rollout
		if ro == nil || ro.PodInFlight != "orders-2" || ro.PodRestartedAt == nil {
			return fmt.Sprintf("orders-2 not restarted yet: rollout %+v", ro)
		}
		restarted = ro.PodRestartedAt.Time
		return ""
	})
	cur = fw.WaitCondition(t, rc, v1alpha1.ConditionDegraded, metav1.ConditionTrue, "", 60*time.Second)
	degraded := framework.Condition(cur, v1alpha1.ConditionDegraded)
	t.Logf("while orders-2 is held: Degraded %s: %s", degraded.Reason, degraded.Message)
	// Both times are whole seconds, the restart's rounded down.
	if after := degraded.LastTransitionTime.Sub(restarted); after < timeout-time.Second {
		t.Errorf("Degraded %s after orders-2 was restarted, before its readinessTimeout (%s) was over: %s", after, timeout, degraded.Message)
	}
	if degraded.Reason != v1alpha1.ReasonNodeNotReady || !strings.Contains(degraded.Message, "orders-2") {
		t.Errorf("Degraded %s: %s; want %s naming orders-2", degraded.Reason, degraded.Message, v1alpha1.ReasonNodeNotReady)
	}
	if cur.Status.Rollout == nil || cur.Status.Rollout.PodInFlight != "orders-2" {
		t.Fatalf("rollout status while stalled: %+v", cur.Status.Rollout)
	}
	// Nothing further happens while the pod is held.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		for name, b := range before {
			p := &corev1.Pod{}
			if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
				t.Fatal(err)
			}
			if string(p.UID) != b || p.DeletionTimestamp != nil {
				t.Fatalf("pod %s was touched while the rollout was stalled", name)
			}
		}
		if v := consumerVersion(t, ns, "orders-api"); v != "" && v != oldVersion {
			t.Fatalf("the consumer was restarted on %s while the rollout was stalled", v)
		}
	}
	if warnings := framework.Reasons(framework.Warnings(fw.ClusterEvents(t, ns, "orders"))); !slices.Contains(warnings, degraded.Reason) {
		t.Errorf("no %s warning event (warnings: %v)", degraded.Reason, warnings)
	}
	if exists, _ := fw.LeaseExists(oldLease); !exists {
		t.Fatal("the old lease was revoked while the rollout was stalled")
	}
	if !fw.Authenticates(oldUser, oldPass) {
		t.Fatal("the old credential stopped working while the rollout was stalled")
	}
	// Every Redis runs on (the held kubelet stops none), orders-2's too, with the old user.
	if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); msg != "" {
		t.Fatalf("while the rollout was stalled: %s", msg)
	}

	resume()
	start := time.Now()
	waitRolledOut(t, rc, oldLease, 120*time.Second)
	t.Logf("the rollout finished %s after the kubelet went on", time.Since(start).Round(time.Millisecond))
	fw.WaitCondition(t, rc, v1alpha1.ConditionDegraded, metav1.ConditionFalse, "", 10*time.Second)
	checkRetired(t, rc, "orders-api", oldUser, oldPass, oldLease)
}

// An operator stopped in the middle of a rollout (the consumer's new pods are held not Ready, as
// kwok is paused) and started again resumes it, and the rotation ends with exactly the one new
// lease it began with: the restarted operator issues nothing more, and the old lease is revoked.
func TestOperatorRestartMidRolloutResumesWithOneNewLeaseAndOneRevoked(t *testing.T) {
	ns := fw.Namespace(t, "restart")
	vc := fw.VaultConnection(t, "vault-restart", framework.Allow(ns))
	fw.StandInConsumer(t, ns, "orders-api", 2)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("restart"), framework.WithConsumers("orders-api"))
	cur := fw.WaitReady(t, rc, 60*time.Second)
	oldLease := cur.Status.Credential.LeaseID
	oldUser, oldPass, _ := fw.Credentials(rc)
	if leases := fw.VaultLeases(t, fw.Path("restart")); !slices.Equal(leases, []string{oldLease}) {
		t.Fatalf("Vault leases before the rotation: %v", leases)
	}

	resume := pauseKubelets(t)
	fw.RotateNow(t, rc)
	var newLease string
	framework.Eventually(t, 60*time.Second, func() string {
		cur = fw.Get(t, rc)
		ro := cur.Status.Rollout
		if ro == nil || consumerVersion(t, ns, "orders-api") != ro.TargetVersion {
			return fmt.Sprintf("the consumer is not restarted yet: rollout %+v", ro)
		}
		newLease = cur.Status.Credential.LeaseID
		return ""
	})
	if leases := fw.VaultLeases(t, fw.Path("restart")); len(leases) != 2 || !slices.Contains(leases, oldLease) || !slices.Contains(leases, newLease) {
		t.Fatalf("Vault leases mid-rollout: %v, want the old %s and the new %s", leases, oldLease, newLease)
	}
	fw.RestartOperator(t)
	resume()
	cur = waitRolledOut(t, rc, oldLease, 90*time.Second)
	if cur.Status.Credential.LeaseID != newLease {
		t.Errorf("the rotation ended on lease %s, not on %s it began with", cur.Status.Credential.LeaseID, newLease)
	}
	if leases := fw.VaultLeases(t, fw.Path("restart")); !slices.Equal(leases, []string{newLease}) {
		t.Fatalf("after the resumed rollout Vault holds %v for the role, want exactly the one new lease %s", leases, newLease)
	}
	checkRetired(t, rc, "orders-api", oldUser, oldPass, oldLease)
}

// A consumer that does not exist is reported (ConsumerMissing) and passed over; a paused one is
// reported (ConsumerPaused) and waited for: while it is paused, the rollout stays open and the old
// credential keeps working in Vault's Redis and on the Redis node (the paused consumer's pods run
// on it), while the new one already works there. Once it is resumed the rollout completes and the
// old user and lease are retired.
func TestMissingConsumerIsReportedAndPausedConsumerIsWaitedFor(t *testing.T) {
	ns := fw.Namespace(t, "consumers")
	vc := fw.VaultConnection(t, "vault-consumers", framework.Allow(ns))
	key := fw.StandInConsumer(t, ns, "paused-api", 2)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), framework.WithConsumers("ghost", "paused-api"))
	cur := fw.WaitReady(t, rc, 60*time.Second)
	oldLease := cur.Status.Credential.LeaseID
	oldUser, oldPass, _ := fw.Credentials(rc)
	d := &appsv1.Deployment{}
	if err := fw.Client.Get(context.Background(), key, d); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Paused = true
	if err := fw.Client.Patch(context.Background(), d, patch); err != nil {
		t.Fatal(err)
	}

	fw.RotateNow(t, rc)
	cur = fw.WaitCondition(t, rc, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonConsumerPaused, 60*time.Second)
	reasons := framework.Reasons(fw.ClusterEvents(t, ns, "orders"))
	if !slices.Contains(reasons, v1alpha1.ReasonConsumerMissing) || !slices.Contains(reasons, v1alpha1.ReasonConsumerPaused) {
		t.Errorf("events %v: want ConsumerMissing and ConsumerPaused", reasons)
	}
	if cur.Status.Rollout == nil {
		t.Fatal("the rollout finished although a consumer is paused")
	}
	if exists, _ := fw.LeaseExists(oldLease); !exists {
		t.Fatal("the old lease was revoked while a paused consumer still runs on it")
	}
	if !fw.Authenticates(oldUser, oldPass) {
		t.Error("the old credential stopped working in Vault's Redis while a paused consumer still runs on it")
	}
	if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); msg != "" {
		t.Errorf("while a paused consumer still runs on the old credential: %s", msg)
	}
	newUser, newPass, _ := fw.Credentials(rc)
	if newUser == oldUser {
		t.Error("the consumers' Secret still holds the old credential although every node accepts the new one")
	} else if msg := fw.OnEveryPod(rc, newUser, newPass, true); msg != "" {
		t.Error(msg)
	}
	if v := consumerVersion(t, ns, "paused-api"); v == cur.Status.Rollout.TargetVersion {
		t.Error("the paused consumer's template was changed")
	}

	if err := fw.Client.Get(context.Background(), key, d); err != nil {
		t.Fatal(err)
	}
	patch = client.MergeFrom(d.DeepCopy())
	d.Spec.Paused = false
	if err := fw.Client.Patch(context.Background(), d, patch); err != nil {
		t.Fatal(err)
	}
	waitRolledOut(t, rc, oldLease, 60*time.Second)
	checkRetired(t, rc, "paused-api", oldUser, oldPass, oldLease)
	fw.WaitCondition(t, rc, v1alpha1.ConditionDegraded, metav1.ConditionFalse, "", 10*time.Second)
}

// pauseKubelets stops kwok, so that pods on its fake node (the consumers) are not made Ready,
// until the returned function (or the end of the test) starts it again.
func pauseKubelets(t *testing.T) (resume func()) {
	t.Helper()
	fw.Ground.Workloads.PauseKubelets()
	resumed := false
	resume = func() {
		if resumed {
			return
		}
		resumed = true
		if err := fw.Ground.Workloads.ResumeKubelets(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(resume)
	return resume
}

// pauseRealKubelet holds the real node's kubelet (testground's Node.PauseKubelet: the Redis pods
// run on, but none starts, stops or changes its status) until the returned function, or the end
// of the test, lets it go on.
func pauseRealKubelet(t *testing.T) (resume func()) {
	t.Helper()
	if err := fw.Ground.Node.PauseKubelet(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume = func() {
		if resumed {
			return
		}
		resumed = true
		if err := fw.Ground.Node.ResumeKubelet(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(resume)
	return resume
}

func countOf(list []string, v string) int {
	n := 0
	for _, x := range list {
		if x == v {
			n++
		}
	}
	return n
}
