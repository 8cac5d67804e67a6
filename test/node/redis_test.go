package node

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// A RedisCluster on the real node: its pods become Ready through the kubelet's own probe, asking
// the pod's probe sidecar over HTTP (no kwok runs here, so nothing else could set Ready), the replicas replicate from pod 0 reached by
// its DNS name, and the credential keyroll wrote authenticates on every pod by pod IP and through
// the client Service's ClusterIP (kube-proxy's rules), from the host and from a pod.
func TestRealNodeRunsRedisWithARealProbe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := fw.Namespace(t, "probe")
	// The VaultConnection reaches Vault through the node's bridge, the address pods use; the
	// operator in this process reaches it there too.
	vc := fw.VaultConnection(t, "vault-probe", framework.Allow(ns), framework.Address(fw.Ground.Vault.PodAddr))
	start := time.Now()
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("node"), framework.Replicas(3))
	fw.WaitReady(t, rc, 3*time.Minute)
	t.Logf("RedisCluster Ready with 3 real pods %s after it was created", time.Since(start).Round(time.Millisecond))
	defer fw.DeleteAndWait(t, rc, time.Minute)

	user, pass, ok := fw.Credentials(rc)
	if !ok {
		t.Fatalf("no Secret %s/cache-credentials", ns)
	}
	pods := map[string]*corev1.Pod{}
	for i := range 3 {
		name := fmt.Sprintf("cache-%d", i)
		p, err := fw.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods[name] = p
		checkRealPod(t, p)
		addr := framework.PodAddr(p)
		if who, err := testground.RedisWhoAmI(addr, user, pass); err != nil || who != user {
			t.Errorf("the credential does not authenticate on %s at %s: %q, %v", name, addr, who, err)
		}
	}
	primaryIP := pods["cache-0"].Status.PodIP
	ips, err := fw.Ground.Node.LookupHost(ctx, "cache-0.cache-headless."+ns+".svc."+testground.ClusterDomain)
	if err != nil || len(ips) != 1 || ips[0] != primaryIP {
		t.Errorf("cache-0.cache-headless resolves to %v (%v), want pod 0's IP %s", ips, err, primaryIP)
	}
	ready := time.Now()
	for _, replica := range []string{"cache-1", "cache-2"} {
		// A replica is Ready once its own Redis knows the credential; its link to the primary
		// comes up within a few seconds.
		framework.Eventually(t, 30*time.Second, func() string {
			info, err := fw.RedisCLI(ctx, ns, replica, "INFO", "replication")
			if err != nil {
				return fmt.Sprintf("INFO replication on %s: %v", replica, err)
			}
			for _, want := range []string{"role:slave", "master_host:cache-0.cache-headless", "master_link_status:up"} {
				if !strings.Contains(info, want) {
					return fmt.Sprintf("INFO replication on %s lacks %q:\n%s\nits log:\n%s", replica, want, info, podLog(ctx, ns, replica))
				}
			}
			return ""
		})
	}
	t.Logf("both replicas' links to cache-0 up %s after the RedisCluster was Ready", time.Since(ready).Round(time.Millisecond))
	checkClientService(t, ctx, ns, user, pass)
	checkConsumer(t, ctx, ns)
}

// checkConsumer runs the test consumer (ConsumerImage) in namespace ns against the client
// Service, by its DNS name, with the credentials Secret mounted: it runs commands and none fails.
func checkConsumer(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	pod := testground.ConsumerPod(ns, "consumer", "cache:6379", "cache-credentials")
	if _, err := fw.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, func() string {
		p, err := fw.Clientset.CoreV1().Pods(ns).Get(ctx, "consumer", metav1.GetOptions{})
		if err != nil || p.Status.PodIP == "" {
			return fmt.Sprintf("consumer pod has no IP yet (%v): %s", err, fw.PodSummary(ns))
		}
		s, err := testground.ReadConsumerStats(p.Status.PodIP)
		if err != nil || s.OK < 20 {
			return fmt.Sprintf("consumer stats %+v (%v); log:\n%s", s, err, podLog(ctx, ns, "consumer"))
		}
		if s.Failed != 0 {
			t.Fatalf("the consumer counted failed commands against a healthy cluster: %+v", s)
		}
		return ""
	})
}

// podLog is the end of a pod's log, for failure messages.
func podLog(ctx context.Context, ns, pod string) string {
	b, err := fw.Clientset.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{TailLines: ptr.To[int64](30)}).DoRaw(ctx)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// checkRealPod asserts that a pod runs on the real node, in containerd, and that the kubelet
// found it Ready.
func checkRealPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if p.Spec.NodeName != testground.RealNodeName {
		t.Errorf("%s runs on %q, want the real node %s", p.Name, p.Spec.NodeName, testground.RealNodeName)
	}
	if len(p.Status.ContainerStatuses) != 1 {
		t.Fatalf("%s has container statuses %+v", p.Name, p.Status.ContainerStatuses)
	}
	c := p.Status.ContainerStatuses[0]
	if !c.Ready || c.State.Running == nil || !strings.HasPrefix(c.ContainerID, "containerd://") {
		t.Errorf("%s: container ready=%v state=%+v id=%q: want a running, Ready containerd container", p.Name, c.Ready, c.State, c.ContainerID)
	}
	if !framework.PodReady(p) {
		t.Errorf("%s is not Ready", p.Name)
	}
}

// checkClientService connects through the client Service's ClusterIP in namespace ns: from the
// host (kube-proxy's OUTPUT rules) and from a replica pod by the Service's DNS name (the pod's
// resolver is CoreDNS).
func checkClientService(t *testing.T, ctx context.Context, ns, user, pass string) {
	t.Helper()
	svc, err := fw.Clientset.CoreV1().Services(ns).Get(ctx, "cache", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "6379")
	// kube-proxy may still be writing the rules of a new Service.
	var who string
	framework.Eventually(t, 30*time.Second, func() string {
		if who, err = testground.RedisWhoAmI(addr, user, pass); err != nil || who != user {
			return fmt.Sprintf("through the client Service %s: %q, %v", addr, who, err)
		}
		return ""
	})
	out, err := fw.RedisCLI(ctx, ns, "cache-2", "-h", "cache", "INFO", "replication")
	if err != nil || !strings.Contains(out, "role:master") {
		t.Errorf("from cache-2, the client Service cache answers INFO replication with %q (%v), want the primary", out, err)
	}
}

// A change to the ACL Secret of a running RedisCluster is in its pods' volume within the kubelet's
// sync period. The operator is stopped meanwhile, so that it does not undo the change.
func TestMountedSecretChangeReachesThePod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := fw.Namespace(t, "mounted")
	vc := fw.VaultConnection(t, "vault-mounted", framework.Allow(ns), framework.Address(fw.Ground.Vault.PodAddr))
	rc := fw.RedisCluster(t, ns, "sessions", vc.Name, fw.Path("node"))
	fw.WaitReady(t, rc, 3*time.Minute)
	defer fw.DeleteAndWait(t, rc, time.Minute)
	fw.StopOperator()
	defer fw.RestartOperator(t) // before the deferred deletion, whose finalizer needs the operator
	acl, err := fw.Clientset.CoreV1().Secrets(ns).Get(ctx, "sessions-acl", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const key = "propagation-check"
	nonce := fmt.Sprintf("changed-%d", time.Now().UnixNano())
	acl.Data[key] = []byte(nonce)
	if _, err := fw.Clientset.CoreV1().Secrets(ns).Update(ctx, acl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	var took time.Duration
	framework.Eventually(t, 2*testground.KubeletSyncFrequency+10*time.Second, func() string {
		out, _, err := fw.Ground.Node.Exec(ctx, ns, "sessions-0", "redis", "cat", "/etc/keyroll/acl/"+key)
		if err != nil || strings.TrimSpace(out) != nonce {
			return fmt.Sprintf("the pod's /etc/keyroll/acl/%s holds %q (%v), want %q", key, out, err, nonce)
		}
		took = time.Since(changed)
		return ""
	})
	t.Logf("the ACL Secret's change reached the running pod's volume after %s (kubelet syncFrequency %s)", took.Round(time.Millisecond), testground.KubeletSyncFrequency)
	// The pod refreshes its volume on its sync, every syncFrequency with up to half of it as jitter.
	if limit := testground.KubeletSyncFrequency * 3 / 2; took > limit+2*time.Second {
		t.Errorf("the change took %s, longer than the kubelet's sync period (%s with jitter)", took, limit)
	}
}
