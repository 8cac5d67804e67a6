package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// recordPods follows the Redis pods of cluster ns/name: their restarts (the moment a pod is marked
// for deletion) with the state of the other pods then.
func recordPods(t *testing.T, ns, cluster string) *podRecorder {
	t.Helper()
	return &podRecorder{fw.WatchPods(t, ns, v1beta1.LabelCluster+"="+cluster)}
}

type podRecorder struct{ *framework.PodWatch }

// checkOneAtATime checks that the pods on a superseded credential were restarted in the order
// given (replicas first, the primary last), each while every other pod was Ready. keyroll only
// ever restarts pods that do not run the new version; a pod deleted while it already ran it was
// deleted by someone else (logged, not counted).
func (r *podRecorder) checkOneAtATime(t *testing.T, newVersion string, order ...string) {
	t.Helper()
	var got, details []string
	for _, rs := range r.Terminations() {
		version := rs.Annotations[v1beta1.AnnotationCredentialVersion]
		details = append(details, fmt.Sprintf("%s (credential %s) at %s", rs.Pod, version, rs.At.Format("15:04:05.000")))
		if version == newVersion {
			t.Logf("pod %s was deleted while it already ran the new credential, not by keyroll", rs.Pod)
			continue
		}
		got = append(got, rs.Pod)
		// A pod marked for deletion still reports Ready until its kubelet stops it: it counts as not Ready.
		if others := slices.Compact(slices.Sorted(slices.Values(append(rs.NotReady, rs.Terminating...)))); len(others) > 0 {
			t.Errorf("pod %s was restarted while %v were not Ready", rs.Pod, others)
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
func podRuns(t *testing.T, rc *v1beta1.RedisCluster) map[string]string {
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

// watchPublication watches the consumers' Secret of rc and its consumer Deployment: the first
// time each shows a credential version other than oldVersion, the credential in the Secret must
// already log in on every Redis node. The returned function lists what went otherwise (a
// acceptedEverywhere says "" when every Redis pod lets user log in. A pod that does not answer is
// asked again, every second for a minute at most, and must accept the user then: with
// rollout.redisPods Restart the pods restart one at a time right after the credential is
// published, and a check that comes late may find one restarting (it comes back with the user in
// its aclfile). A pod that refuses the user fails at once.
func acceptedEverywhere(rc *v1beta1.RedisCluster, user, pass string) string {
	deadline := time.Now().Add(time.Minute)
	for {
		_, refused, failed, err := fw.NodeLogins(rc, user, pass)
		switch {
		case err != nil:
			return err.Error()
		case len(refused) > 0:
			return fmt.Sprintf("user %s does not log in on %v", user, refused)
		case len(failed) == 0:
			return ""
		case time.Now().After(deadline):
			return fmt.Sprintf("user %s: no answer from %v for a minute", user, failed)
		}
		time.Sleep(time.Second)
	}
}

// publication not seen included).
func watchPublication(t *testing.T, rc *v1beta1.RedisCluster, consumer, oldVersion string) func() []string {
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
		} else if v := sec.Annotations[v1beta1.AnnotationCredentialVersion]; v != version {
			msg = fmt.Sprintf("the consumers' Secret holds version %s", v)
		} else {
			msg = acceptedEverywhere(rc, string(sec.Data["username"]), string(sec.Data["password"]))
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
				if v := s.Annotations[v1beta1.AnnotationCredentialVersion]; v != "" && v != oldVersion {
					check("the consumers' Secret", v)
				}
			}
		}
	}()
	go func() {
		for ev := range dw.ResultChan() {
			if d, ok := ev.Object.(*appsv1.Deployment); ok {
				if v := d.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]; v != "" && v != oldVersion {
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
	oldLease, oldVersion := cur.Status.Credential.Lease.LeaseID, cur.Status.Credential.Version
	oldUser, oldPass, _ := fw.Credentials(rc)
	if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); msg != "" {
		t.Fatal(msg)
	}
	runs := podRuns(t, rc)
	sts := &appsv1.StatefulSet{}
	if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), sts); err != nil {
		t.Fatal(err)
	}
	if v, ok := sts.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]; ok {
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
		if v := fw.ConsumerVersion(t, ns, "orders-api"); v == "" || v == oldVersion {
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
	cur = fw.CheckRetired(t, rc, "orders-api", oldUser, oldPass, oldLease)
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
	for _, once := range []string{v1beta1.EventCredentialsIssued, v1beta1.EventRotationStarted, v1beta1.EventUsersApplied,
		v1beta1.EventConsumerRestarted, v1beta1.EventRotationFinished, v1beta1.EventUsersRetired, v1beta1.EventLeaseRevoked} {
		if n := countOf(got, once); n != 1 {
			t.Errorf("%d %s events for one rotation, want 1 (the rotation's events: %v)", n, once, got)
		}
	}
	if countOf(got, v1beta1.EventPodRestarted) != 0 {
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
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("orders-api"), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.RedisPods = v1beta1.RedisPodsRestart
	})
	cur := fw.WaitReady(t, rc, 90*time.Second)
	oldLease, oldVersion := cur.Status.Credential.Lease.LeaseID, cur.Status.Credential.Version
	oldUser, oldPass, _ := fw.Credentials(rc)
	pods := recordPods(t, ns, "orders")
	events := fw.ClusterEvents(t, ns, "orders")
	before, warningsBefore := framework.Reasons(events), framework.Reasons(framework.Warnings(events))
	// The first credential replaced none: the pods, which started before it, got its user live
	// and are not restarted for it.
	for _, r := range []string{v1beta1.EventRotationStarted, v1beta1.EventPodRestarted} {
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
				v = d.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]
			}
			if seen || v == "" || v == oldVersion {
				continue
			}
			seen = true
			now := pods.Pods()
			consumerMu.Lock()
			for name, p := range now {
				if p.Annotations[v1beta1.AnnotationCredentialVersion] != v || !isReady(p) {
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
		if v := fw.ConsumerVersion(t, ns, "orders-api"); (v == "" || v == oldVersion) && !fw.Authenticates(oldUser, oldPass) {
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
	fw.CheckRetired(t, rc, "orders-api", oldUser, oldPass, oldLease)
	events = fw.ClusterEvents(t, ns, "orders")
	got := framework.NewReasons(before, framework.Reasons(events))
	for _, want := range []string{v1beta1.EventPodRestarted, v1beta1.EventUsersApplied} {
		if !slices.Contains(got, want) {
			t.Errorf("no %s event (the rotation's events: %v)", want, got)
		}
	}
	for _, once := range []string{v1beta1.EventRotationStarted, v1beta1.EventConsumerRestarted, v1beta1.EventRotationFinished,
		v1beta1.EventUsersRetired, v1beta1.EventLeaseRevoked} {
		if n := countOf(got, once); n != 1 {
			t.Errorf("%d %s events for one rotation, want 1 (the rotation's events: %v)", n, once, got)
		}
	}
	if w := framework.NewReasons(warningsBefore, framework.Reasons(framework.Warnings(events))); len(w) > 0 {
		t.Errorf("warnings during a healthy rotation: %v (every warning: %v)", w, framework.Notes(framework.Warnings(events)))
	}
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
	oldLease := cur.Status.Credential.Lease.LeaseID
	oldUser, oldPass, _ := fw.Credentials(rc)
	fw.PauseDeployment(t, key, true)

	fw.RotateNow(t, rc)
	cur = fw.WaitCondition(t, rc, v1beta1.ConditionDegraded, metav1.ConditionTrue, v1beta1.ReasonConsumerPaused, 60*time.Second)
	reasons := framework.Reasons(fw.WaitClusterEvents(t, ns, "orders", 10*time.Second, v1beta1.ReasonConsumerMissing, v1beta1.ReasonConsumerPaused))
	if !slices.Contains(reasons, v1beta1.ReasonConsumerMissing) || !slices.Contains(reasons, v1beta1.ReasonConsumerPaused) {
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
	if v := fw.ConsumerVersion(t, ns, "paused-api"); v == cur.Status.Rollout.TargetVersion {
		t.Error("the paused consumer's template was changed")
	}

	fw.PauseDeployment(t, key, false)
	fw.WaitRolledOut(t, rc, oldLease, 60*time.Second)
	fw.CheckRetired(t, rc, "paused-api", oldUser, oldPass, oldLease)
	fw.WaitCondition(t, rc, v1beta1.ConditionDegraded, metav1.ConditionFalse, "", 10*time.Second)
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
