package integration

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
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
	w, err := cs.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelCluster + "=" + cluster})
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

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil
		}
	}
	return false
}

func consumerDeployment(t *testing.T, ns, name string) {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example/app:1"}}},
			},
		},
	}
	if err := k8s.Create(context.Background(), d); err != nil {
		t.Fatal(err)
	}
}

func rotateNow(t *testing.T, rc *v1alpha1.RedisCluster, value string) {
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

func TestRotationRollsPodsOneAtATimeThenConsumersAndRevokesTheOldLeaseLast(t *testing.T) {
	namespace(t, "rotate")
	vaultConnection(t, "vault-rotate", ground.Vault.Addr, "rotate")
	consumerDeployment(t, "rotate", "orders-api")
	rc := redisCluster(t, "rotate", "orders", "vault-rotate", "database/creds/orders", func(rc *v1alpha1.RedisCluster) {
		rc.Spec.Rollout.Consumers = []v1alpha1.ConsumerReference{{Kind: "Deployment", Name: "orders-api"}}
	})
	cur := waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", 60*time.Second)
	oldLease, oldVersion := cur.Status.Credential.LeaseID, cur.Status.Credential.Version
	oldUser, oldPass, _ := credentials(t, rc)
	pods := recordPods(t, "rotate", "orders")

	// Watch the consumer: when it gets the new version, every Redis pod must already run it.
	var consumerEarly []string
	var consumerMu sync.Mutex
	dw, err := cs.AppsV1().Deployments("rotate").Watch(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=orders-api"})
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
	time.Sleep(500 * time.Millisecond) // let the watches list the current state

	start := time.Now()
	rotateNow(t, rc, "1")
	// The old credential keeps working while the rollout runs: as long as the consumer (the last
	// step before revocation) has not been given the new version, it must authenticate. The
	// consumer is read before the credential is tried, so a revocation in between cannot pass for
	// a failure.
	eventually(t, 120*time.Second, func() string {
		d := &appsv1.Deployment{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: "rotate", Name: "orders-api"}, d); err != nil {
			return err.Error()
		}
		v := d.Spec.Template.Annotations[v1alpha1.AnnotationCredentialVersion]
		consumerOnOld := v == "" || v == oldVersion
		if consumerOnOld && !authenticates(oldUser, oldPass) {
			t.Errorf("the old credential stopped working before the consumer was restarted")
		}
		cur = get(t, rc)
		if cur.Status.Credential.Version == oldVersion || cur.Status.Rollout != nil {
			return fmt.Sprintf("rollout not finished: %+v", cur.Status.Rollout)
		}
		for _, l := range cur.Status.Leases {
			if l.LeaseID == oldLease {
				return "the old lease is still in the ledger"
			}
		}
		return ""
	})
	t.Logf("rotation rolled out and old lease revoked %s after rotate-now", time.Since(start).Round(time.Millisecond))

	pods.checkOneAtATime(t, cur.Status.Credential.Version, "orders-2", "orders-1", "orders-0")
	consumerMu.Lock()
	if len(consumerEarly) > 0 {
		t.Errorf("the consumer got the new version before every Redis pod was Ready on it: %v", consumerEarly)
	}
	consumerMu.Unlock()
	d := &appsv1.Deployment{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: "rotate", Name: "orders-api"}, d); err != nil {
		t.Fatal(err)
	}
	if d.Spec.Template.Annotations[v1alpha1.AnnotationCredentialVersion] != cur.Status.Credential.Version {
		t.Errorf("consumer template annotation %q, want %q", d.Spec.Template.Annotations[v1alpha1.AnnotationCredentialVersion], cur.Status.Credential.Version)
	}
	if authenticates(oldUser, oldPass) {
		t.Error("the old credential still works after the rollout")
	}
	if exists, _ := leaseExists(t, oldLease); exists {
		t.Error("the superseded lease is still live in Vault")
	}
	newUser, newPass, _ := credentials(t, rc)
	if !authenticates(newUser, newPass) || newUser == oldUser {
		t.Error("the new credential does not work")
	}
	if cur.Status.RotateNowAcknowledged != "1" {
		t.Errorf("rotate-now not acknowledged: %q", cur.Status.RotateNowAcknowledged)
	}
	reasons := eventReasons(t, "rotate", "orders")
	for _, want := range []string{v1alpha1.EventRotationStarted, v1alpha1.EventPodRestarted, v1alpha1.EventConsumerRestarted, v1alpha1.EventRotationFinished, v1alpha1.EventLeaseRevoked} {
		if !slices.Contains(reasons, want) {
			t.Errorf("no %s event (have %v)", want, reasons)
		}
	}
	// Each step once: a reconcile that read a lagging cache must not finish the rollout or revoke
	// the lease a second time.
	for _, once := range []string{v1alpha1.EventRotationStarted, v1alpha1.EventRotationFinished, v1alpha1.EventLeaseRevoked} {
		if n := countOf(reasons, once); n != 1 {
			t.Errorf("%d %s events for one rotation, want 1 (have %v)", n, once, reasons)
		}
	}
}

func TestStalledRolloutTouchesNoFurtherPodAndResumesWhenReady(t *testing.T) {
	namespace(t, "stall")
	vaultConnection(t, "vault-stall", ground.Vault.Addr, "stall")
	rc := redisCluster(t, "stall", "orders", "vault-stall", "database/creds/orders", func(rc *v1alpha1.RedisCluster) {
		rc.Spec.Rollout.ReadinessTimeout = &metav1.Duration{Duration: 10 * time.Second}
	})
	cur := waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", 60*time.Second)
	oldLease := cur.Status.Credential.LeaseID
	before := map[string]string{}
	for _, name := range []string{"orders-0", "orders-1"} {
		p := &corev1.Pod{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: "stall", Name: name}, p); err != nil {
			t.Fatal(err)
		}
		before[name] = string(p.UID)
	}

	resume := pauseKubelets(t)
	rotateNow(t, rc, "stall-1")
	cur = waitCondition(t, rc, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonRolloutStalled, 60*time.Second)
	if cur.Status.Rollout == nil || cur.Status.Rollout.PodInFlight != "orders-2" {
		t.Fatalf("rollout status while stalled: %+v", cur.Status.Rollout)
	}
	time.Sleep(3 * time.Second)
	for name, b := range before {
		p := &corev1.Pod{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: "stall", Name: name}, p); err != nil {
			t.Fatal(err)
		}
		if string(p.UID) != b || p.DeletionTimestamp != nil {
			t.Errorf("pod %s was touched while the rollout was stalled", name)
		}
	}
	if !slices.Contains(eventReasons(t, "stall", "orders"), v1alpha1.EventRolloutStalled) {
		t.Error("no RolloutStalled event")
	}
	if exists, _ := leaseExists(t, oldLease); !exists {
		t.Fatal("the old lease was revoked while the rollout was stalled")
	}

	resume()
	eventually(t, 90*time.Second, func() string {
		cur = get(t, rc)
		if cur.Status.Rollout != nil || len(cur.Status.Leases) != 1 {
			return fmt.Sprintf("rollout %+v, leases %d", cur.Status.Rollout, len(cur.Status.Leases))
		}
		return ""
	})
	waitCondition(t, rc, v1alpha1.ConditionDegraded, metav1.ConditionFalse, "", 10*time.Second)
	if exists, _ := leaseExists(t, oldLease); exists {
		t.Error("the old lease is still live after the resumed rollout")
	}
}

// vaultLeases lists the leases Vault holds for a role.
func vaultLeases(t *testing.T, role string) []string {
	t.Helper()
	s, err := ground.Vault.Root.Logical().List("sys/leases/lookup/database/creds/" + role)
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		return nil
	}
	var out []string
	for _, k := range s.Data["keys"].([]any) {
		out = append(out, "database/creds/"+role+"/"+k.(string))
	}
	return out
}

func TestOperatorRestartMidRolloutResumesWithOneNewLeaseAndOneRevoked(t *testing.T) {
	namespace(t, "restart")
	vaultConnection(t, "vault-restart", ground.Vault.Addr, "restart")
	rc := redisCluster(t, "restart", "orders", "vault-restart", "database/creds/restart", func(rc *v1alpha1.RedisCluster) {
		rc.Spec.Rollout.ReadinessTimeout = &metav1.Duration{Duration: 10 * time.Second}
	})
	cur := waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", 60*time.Second)
	oldLease := cur.Status.Credential.LeaseID
	if leases := vaultLeases(t, "restart"); !slices.Equal(leases, []string{oldLease}) {
		t.Fatalf("Vault leases before the rotation: %v", leases)
	}

	// Hold the first restarted pod not-Ready, so that the operator is stopped mid-rollout.
	resume := pauseKubelets(t)
	rotateNow(t, rc, "restart-1")
	eventually(t, 30*time.Second, func() string {
		if ro := get(t, rc).Status.Rollout; ro == nil || ro.PodInFlight == "" {
			return "no pod in flight yet"
		}
		return ""
	})
	restartOperator(t)
	resume()
	eventually(t, 90*time.Second, func() string {
		cur = get(t, rc)
		if cur.Status.Rollout != nil || len(cur.Status.Leases) != 1 || cur.Status.Leases[0].LeaseID == oldLease {
			return fmt.Sprintf("rollout %+v, ledger %+v", cur.Status.Rollout, cur.Status.Leases)
		}
		return ""
	})
	leases := vaultLeases(t, "restart")
	if len(leases) != 1 || leases[0] != cur.Status.Credential.LeaseID {
		t.Fatalf("after the resumed rollout Vault holds %v for the role, want exactly the one new lease %s", leases, cur.Status.Credential.LeaseID)
	}
	for _, name := range []string{"orders-0", "orders-1", "orders-2"} {
		p := &corev1.Pod{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: "restart", Name: name}, p); err != nil {
			t.Fatal(err)
		}
		if p.Annotations[v1alpha1.AnnotationCredentialVersion] != cur.Status.Credential.Version || !isReady(p) {
			t.Errorf("pod %s is not Ready on the new credential", name)
		}
	}
}

func TestMissingConsumerIsReportedAndPausedConsumerIsWaitedFor(t *testing.T) {
	namespace(t, "consumers")
	vaultConnection(t, "vault-consumers", ground.Vault.Addr, "consumers")
	consumerDeployment(t, "consumers", "paused-api")
	rc := redisCluster(t, "consumers", "orders", "vault-consumers", "database/creds/orders", func(rc *v1alpha1.RedisCluster) {
		rc.Spec.Replicas = 1
		rc.Spec.Rollout.Consumers = []v1alpha1.ConsumerReference{
			{Kind: "Deployment", Name: "ghost"}, {Kind: "Deployment", Name: "paused-api"},
		}
	})
	cur := waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", 60*time.Second)
	oldLease := cur.Status.Credential.LeaseID
	d := &appsv1.Deployment{}
	key := client.ObjectKey{Namespace: "consumers", Name: "paused-api"}
	if err := k8s.Get(context.Background(), key, d); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Paused = true
	if err := k8s.Patch(context.Background(), d, patch); err != nil {
		t.Fatal(err)
	}

	rotateNow(t, rc, "1")
	cur = waitCondition(t, rc, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonConsumerPaused, 60*time.Second)
	reasons := eventReasons(t, "consumers", "orders")
	if !slices.Contains(reasons, v1alpha1.ReasonConsumerMissing) || !slices.Contains(reasons, v1alpha1.ReasonConsumerPaused) {
		t.Errorf("events %v: want ConsumerMissing and ConsumerPaused", reasons)
	}
	if cur.Status.Rollout == nil {
		t.Fatal("the rollout finished although a consumer is paused")
	}
	if exists, _ := leaseExists(t, oldLease); !exists {
		t.Fatal("the old lease was revoked while a paused consumer still runs on it")
	}

	if err := k8s.Get(context.Background(), key, d); err != nil {
		t.Fatal(err)
	}
	patch = client.MergeFrom(d.DeepCopy())
	d.Spec.Paused = false
	if err := k8s.Patch(context.Background(), d, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() string {
		cur = get(t, rc)
		if cur.Status.Rollout != nil || len(cur.Status.Leases) != 1 {
			return fmt.Sprintf("rollout %+v, leases %d", cur.Status.Rollout, len(cur.Status.Leases))
		}
		return ""
	})
	if exists, _ := leaseExists(t, oldLease); exists {
		t.Error("the old lease is still live after the rollout")
	}
	waitCondition(t, rc, v1alpha1.ConditionDegraded, metav1.ConditionFalse, "", 10*time.Second)
}

// pauseKubelets stops kwok, so that restarted pods are not made Ready, until the returned
// function (or the end of the test) starts it again.
func pauseKubelets(t *testing.T) (resume func()) {
	t.Helper()
	ground.Workloads.PauseKubelets()
	resumed := false
	resume = func() {
		if resumed {
			return
		}
		resumed = true
		if err := ground.Workloads.ResumeKubelets(); err != nil {
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
