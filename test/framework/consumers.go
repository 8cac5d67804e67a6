package framework

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/test/testground"
)

// Consumers follows the pods of a consumer Deployment: the counters of each running pod (read
// from /stats) and the final counters of each pod that stopped (its termination message), so
// that no command of a replaced pod goes uncounted.
type Consumers struct {
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

// StartConsumers creates a Deployment of consumer pods against redisAddr with the Secret's
// credential (changed by opts), waits until each runs commands, and follows them until the test
// ends.
func (f *Framework) StartConsumers(t testing.TB, ns, name string, replicas int32, redisAddr, secret string, opts ...func(*appsv1.Deployment)) *Consumers {
	t.Helper()
	d := testground.ConsumerDeployment(ns, name, replicas, redisAddr, secret)
	for _, o := range opts {
		o(d)
	}
	return f.follow(t, d, ns, name, replicas)
}

// StartConsumerSet is StartConsumers with a StatefulSet (its pods mount the Secret).
func (f *Framework) StartConsumerSet(t testing.TB, ns, name string, replicas int32, redisAddr, secret string) *Consumers {
	t.Helper()
	return f.follow(t, testground.ConsumerStatefulSet(ns, name, replicas, redisAddr, secret), ns, name, replicas)
}

// follow creates the workload of consumer pods labelled app=name, waits until each of replicas
// runs commands, and follows them until the test ends.
func (f *Framework) follow(t testing.TB, workload client.Object, ns, name string, replicas int32) *Consumers {
	t.Helper()
	if err := f.Client.Create(context.Background(), workload); err != nil {
		t.Fatal(err)
	}
	w, err := f.Clientset.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		t.Fatal(err)
	}
	c := &Consumers{live: map[types.UID]testground.ConsumerStats{}, final: map[types.UID]testground.ConsumerStats{},
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
	t.Cleanup(c.Halt)
	Eventually(t, 2*time.Minute, func() string {
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

// Lingering makes consumer pods go on for d after SIGTERM (their grace period d and 10 s more), as
// an application that drains its work before it stops.
func Lingering(d time.Duration) func(*appsv1.Deployment) {
	return func(dep *appsv1.Deployment) {
		spec := &dep.Spec.Template.Spec
		spec.TerminationGracePeriodSeconds = ptr.To(int64((d + 10*time.Second).Seconds()))
		spec.Containers[0].Args = append(spec.Containers[0].Args, "-linger="+d.String())
	}
}

// CredentialFromEnv makes consumer pods take their credential from env variables that reference
// the Secret, once at start, as an application configured by env does: no volume references it.
func CredentialFromEnv(secret string) func(*appsv1.Deployment) {
	return func(dep *appsv1.Deployment) {
		spec := &dep.Spec.Template.Spec
		c := &spec.Containers[0]
		from := func(key string) *corev1.EnvVarSource {
			return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key}}
		}
		c.Env = append(c.Env, corev1.EnvVar{Name: "REDIS_USERNAME", ValueFrom: from("username")}, corev1.EnvVar{Name: "REDIS_PASSWORD", ValueFrom: from("password")})
		c.Args = append(c.Args, "-credentials-env")
		c.VolumeMounts, spec.Volumes = nil, nil
	}
}

// Halt stops following the pods (the counters stay as last read).
func (c *Consumers) Halt() {
	c.watch.Stop()
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.done.Wait()
}

func (c *Consumers) observe(p *corev1.Pod) {
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
func (c *Consumers) poll() {
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

// Totals are the commands of every pod seen, final counters where a pod stopped, and a
// description (DescribeFailures) of each pod that had failures.
func (c *Consumers) Totals() (ok, failed int64, failures []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	add := func(uid types.UID, s testground.ConsumerStats) {
		ok, failed = ok+s.OK, failed+s.Failed
		if s.Failed > 0 {
			failures = append(failures, DescribeFailures(c.names[uid], s))
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

// DescribeFailures names a consumer pod's failed commands: each of the first the pod kept (when,
// which, as whom, why), and the last.
func DescribeFailures(pod string, s testground.ConsumerStats) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s: %d failed:", pod, s.Failed)
	for _, f := range s.Failures {
		fmt.Fprintf(&b, " [%s %s as %s: %s]", f.At, f.Op, f.User, f.Error)
	}
	fmt.Fprintf(&b, " last: %s (%s)", s.LastError, s.LastFailure)
	return b.String()
}

// Stats are the counters of every pod seen, final ones where a pod stopped.
func (c *Consumers) Stats() []testground.ConsumerStats {
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

// FirstSeenWith is, per consumer pod, when it was first seen running with user.
func (c *Consumers) FirstSeenWith(user string) map[types.UID]time.Time {
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
