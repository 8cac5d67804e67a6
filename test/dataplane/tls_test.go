package dataplane

import (
	"bufio"
	"context"
	"fmt"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redis/go-redis/v9"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// newTestCA is a CA of the test's own, which signs the Redis nodes' certificates as cert-manager's
// CA issuer would.
func newTestCA(t *testing.T) *testground.TestCA {
	t.Helper()
	ca, err := testground.NewTestCA("keyroll test CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// issue signs a serving certificate for rc's names (and ips); it returns the certificate and key
// (PEM) and the serial.
func issue(t *testing.T, ca *testground.TestCA, rc *v1beta1.RedisCluster, ips ...net.IP) (cert, key []byte, sn *big.Int) {
	t.Helper()
	cert, key, sn, err := ca.IssueServer(render.TLSNodeNames(rc), ips...)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key, sn
}

// certificateSecret is the owner's Secret for rc, as cert-manager writes a Certificate's, with the
// label keyroll asks for.
func certificateSecret(rc *v1beta1.RedisCluster, name string, cert, key, ca []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: rc.Namespace, Name: name, Labels: map[string]string{v1beta1.LabelTLSCertificate: rc.Name}},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key, "ca.crt": ca},
	}
}

// tlsCluster creates a TLS RedisCluster with its certificate in the owner's Secret <name>-cert.
func tlsCluster(t *testing.T, ns, name string, ca *testground.TestCA, opts ...framework.ClusterOption) (*v1beta1.RedisCluster, *big.Int) {
	t.Helper()
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	cert, key, sn := issue(t, ca, rc)
	fw.Create(t, certificateSecret(rc, name+"-cert", cert, key, ca.PEM))
	vc := fw.VaultConnection(t, "vault-"+name, framework.Allow(ns))
	opts = append([]framework.ClusterOption{func(rc *v1beta1.RedisCluster) {
		rc.Spec.TLS = &v1beta1.TLSSpec{CertificateSecretRef: &v1beta1.LocalSecretReference{Name: name + "-cert"}}
	}}, opts...)
	return fw.RedisCluster(t, ns, name, vc.Name, fw.Path("orders"), opts...), sn
}

// tlsClient is a Redis client of one node over TLS, checking its certificate against ca for rc.
func tlsClient(rc *v1beta1.RedisCluster, addr, user, pass string, ca []byte) *redis.Client {
	return framework.RedisClientTLS(addr, user, pass, render.ClientTLS(rc, ca))
}

// plaintextRefused sends a command in clear to addr and says what came back: nothing but a closed
// connection is the right answer.
func plaintextRefused(addr, marker string) error {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return nil // refused outright
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(c, "PING %s\r\n", marker); err != nil {
		return nil
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return nil // closed without an answer
	}
	return fmt.Errorf("a plaintext PING to %s was answered %q", addr, strings.TrimSpace(line))
}

// TestTLSClusterRotatesWithoutPlaintext: a 3-pod cluster with TLS, its certificate from a CA
// keyroll made for it, and two consumer pods that connect with TLS and check the certificate
// against the credentials Secret's ca.crt: issue, a
// rotation (no failed command), a restart of every pod onto a new template (replicas first, the
// primary after FAILOVER), and delete. A capture on the node's bridge for the whole test finds no
// password of any user, no AUTH and no ACL SETUSER in clear on port 6379; a plaintext client is
// refused by every node (and its command is seen in the capture: the capture sees what crosses
// in clear), and the consumers' TLS handshakes (their server name is sent in clear) are seen
// between pods.
func TestTLSClusterRotatesWithoutPlaintext(t *testing.T) {
	ns := fw.Namespace(t, "tls")
	capture := framework.StartCapture(t, testground.NodeBridge, []int{render.RedisPort}, 12*time.Minute)
	vc := fw.VaultConnection(t, "vault-tls", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("app"),
		func(rc *v1beta1.RedisCluster) { rc.Spec.TLS = &v1beta1.TLSSpec{} })
	rc = fw.WaitReady(t, rc, 4*time.Minute)
	if c := framework.Condition(rc, v1beta1.ConditionTLSReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("TLSReady %+v on a Ready TLS cluster", c)
	}
	creds := &corev1.Secret{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "cache-credentials"}, creds); err != nil {
		t.Fatal(err)
	}
	if ca := fw.SecretData(ns, "cache-tls-ca", "ca.crt"); ca == "" || string(creds.Data["ca.crt"]) != ca {
		t.Fatalf("the credentials Secret's ca.crt is %q, want the cluster's CA %q", creds.Data["ca.crt"], ca)
	}
	if fw.SecretData(ns, "cache-tls", "ca.key") != "" {
		t.Fatal("the Secret the Redis pods mount holds the CA's key")
	}
	passwords := map[string]string{}
	for k, p := range fw.InternalPasswords(t, rc) {
		passwords[internalUsers[k]] = p
	}
	user, pass, _ := fw.Credentials(rc)
	passwords[user] = pass

	serverName := render.TLSServerName(rc)
	app := fw.StartConsumers(t, ns, "app", 2, "cache:6379", "cache-credentials", func(d *appsv1.Deployment) {
		testground.ConsumerTLS(serverName)(&d.Spec.Template.Spec.Containers[0])
	})
	framework.Eventually(t, time.Minute, func() string {
		if ok, _, _ := app.Totals(); ok < 50 {
			return fmt.Sprintf("%d commands so far", ok)
		}
		return ""
	})
	const marker = "keyroll-plaintext-marker"
	for _, p := range fw.RedisPods(t, rc) {
		if err := plaintextRefused(framework.PodAddr(&p), marker); err != nil {
			t.Error(err)
		}
	}

	from := rc.Status.Credential.Version
	fw.RotateNow(t, rc)
	framework.Eventually(t, 3*time.Minute, func() string { return rotated(t, rc, from) })
	user, pass, _ = fw.Credentials(fw.Get(t, rc))
	passwords[user] = pass
	okRotation, failedRotation, failures := app.Totals()
	t.Logf("consumers over TLS up to the end of the rotation: %d commands ok, %d failed", okRotation, failedRotation)
	if failedRotation != 0 {
		t.Errorf("%d consumer commands failed up to the end of the rotation: %v", failedRotation, failures)
	}

	rw := watchRestarts(t, rc)
	cur := fw.Get(t, rc)
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}}
	if err := fw.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 6*time.Minute, func() string {
		if ro := fw.Get(t, rc).Status.Rollout; ro != nil {
			return fmt.Sprintf("rollout %+v", ro)
		}
		if n := len(rw.Terminations()); n < 3 {
			return fmt.Sprintf("%d pods restarted", n)
		}
		for _, p := range fw.RedisPods(t, rc) {
			if !framework.PodReady(&p) || p.Spec.Containers[0].Resources.Requests.Cpu().MilliValue() != 10 {
				return p.Name + " not Ready on the new template"
			}
		}
		return ""
	})
	var order []string
	for _, r := range rw.Terminations() {
		order = append(order, r.Pod)
	}
	if fmt.Sprint(order) != "[cache-2 cache-1 cache-0]" {
		t.Errorf("restart order %v, want replicas first and the primary last", order)
	}
	if p := fw.Get(t, rc).Status.Primary; p == "cache-0" {
		t.Errorf("status.primary still cache-0 after its restart: want a replica that took over by FAILOVER")
	}
	time.Sleep(2 * time.Second) // the consumers run on for a moment on the new primary
	app.Halt()
	// The restart of the primary, as without TLS (TestVersionChangeRollsReplicasFirstThenFailsOver):
	// writes refused (READONLY) until the client Service follows the role, none acknowledged and lost.
	ok, failed, failures := app.Totals()
	var longest, lost int64
	for _, s := range app.Stats() {
		longest, lost = max(longest, s.LongestOutageMs), lost+s.LostWrites
	}
	t.Logf("consumers over TLS across the restarts: %d commands ok, %d failed, longest outage %d ms, %d lost writes; errors %v",
		ok-okRotation, failed-failedRotation, longest, lost, failures)
	if lost != 0 {
		t.Errorf("%d acknowledged writes were lost", lost)
	}
	if ok <= okRotation {
		t.Errorf("no consumer command succeeded after the restarts")
	}
	fw.DeleteAndWait(t, rc, 2*time.Minute)

	report := capture.Stop()
	t.Logf("capture on %s: %+v", testground.NodeBridge, report)
	if report.Truncated || report.Dropped > 0 || report.Segments == 0 {
		t.Fatalf("the capture is not whole: %+v", report)
	}
	if seen := capture.Find([]byte(marker)); len(seen) == 0 {
		t.Fatalf("the plaintext PING sent to the nodes is not in the capture: it does not see what crosses the bridge in clear")
	}
	podToPod := 0
	for _, s := range capture.Find([]byte(serverName)) {
		if !strings.HasPrefix(s.Flow, testground.NodeIP.String()+":") {
			podToPod++
		}
	}
	if podToPod == 0 {
		t.Fatalf("no TLS handshake between pods (the server name %s in clear) is in the capture: it does not see pod-to-pod traffic", serverName)
	}
	needles := [][]byte{[]byte("$4\r\nAUTH\r\n"), []byte("$4\r\nauth\r\n"), []byte("SETUSER"), []byte("setuser"), []byte("AUTH "), []byte("auth ")}
	if seen := capture.Find(needles...); len(seen) > 0 {
		t.Errorf("in clear on the bridge: %+v", seen)
	}
	for u, p := range passwords { // one at a time, so that a failure names the user, not the password
		for _, s := range capture.Find([]byte(p)) {
			t.Errorf("the password of %s is in clear on the bridge, in flow %s", u, s.Flow)
		}
	}
}

// TestTLSCertificateRotatesWithoutRestart: the owner's Secret gets a new certificate (as
// cert-manager renews one): every node serves it to new connections within the kubelet's refresh
// of the pod's volume, without a restart of any container; a TLS connection opened before goes on.
func TestTLSCertificateRotatesWithoutRestart(t *testing.T) {
	ns := fw.Namespace(t, "tlsrenew")
	ca := newTestCA(t)
	rc, first := tlsCluster(t, ns, "cache", ca, framework.Replicas(2))
	rc = fw.WaitReady(t, rc, 4*time.Minute)
	conf := render.ClientTLS(rc, ca.PEM)
	pods := fw.RedisPods(t, rc)
	for _, p := range pods {
		served, err := redisnode.ServedCertificate(context.Background(), framework.PodAddr(&p), conf)
		if err != nil || served.SerialNumber.Cmp(first) != 0 {
			t.Fatalf("%s serves %v (%v), want the owner's certificate %x", p.Name, served, err, first)
		}
	}
	user, pass, _ := fw.Credentials(rc)
	open := tlsClient(rc, framework.PodAddr(&pods[0]), user, pass, ca.PEM)
	defer open.Close()
	if err := open.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	before := runs(pods)

	cert, key, second := issue(t, ca, rc)
	sec := certificateSecret(rc, "cache-cert", cert, key, ca.PEM)
	if err := fw.Client.Update(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	framework.Eventually(t, 4*time.Minute, func() string {
		for _, p := range pods {
			served, err := redisnode.ServedCertificate(context.Background(), framework.PodAddr(&p), conf)
			if err != nil {
				return err.Error()
			}
			if served.SerialNumber.Cmp(second) != 0 {
				return fmt.Sprintf("%s serves %x", p.Name, served.SerialNumber)
			}
		}
		if c := framework.Condition(fw.Get(t, rc), v1beta1.ConditionTLSReady); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, fmt.Sprintf("%x", second)) {
			return fmt.Sprintf("TLSReady %+v", c)
		}
		return ""
	})
	t.Logf("every node serves the new certificate %s after the Secret changed", time.Since(start).Round(time.Second))
	if err := open.Ping(context.Background()).Err(); err != nil {
		t.Errorf("the connection opened before the new certificate: %v", err)
	}
	if after := runs(fw.RedisPods(t, rc)); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("containers restarted: before %v, after %v", before, after)
	}
	fw.WaitClusterEvents(t, ns, rc.Name, 10*time.Second, v1beta1.ReasonCertificateServed)
}

// withCertificate gives a RedisCluster TLS with the certificate of the owner's Secret secret.
func withCertificate(secret string) framework.ClusterOption {
	return func(rc *v1beta1.RedisCluster) {
		rc.Spec.TLS = &v1beta1.TLSSpec{CertificateSecretRef: &v1beta1.LocalSecretReference{Name: secret}}
	}
}

// TestVaultPluginOverTLS: Vault's database engine, pointed at a TLS cluster's client Service by
// the Vault administrators' guide's TLS commands (tls=true and the cluster's CA), creates the
// credential's user on the primary (keyroll carries it to the replica) and deletes it at `vault
// lease revoke`, over TLS: the nodes take no other connection. Vault runs outside the cluster here
// and reaches the Service by its ClusterIP, so the owner's certificate names that address too.
func TestVaultPluginOverTLS(t *testing.T) {
	ns := fw.Namespace(t, "plugintls")
	vc := fw.VaultConnection(t, "vault-plugintls", framework.Allow(ns), framework.Paths("database/creds/{namespace}.*"))
	ca := newTestCA(t)
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache"}}
	cert, key, _ := issue(t, ca, rc)
	owners := certificateSecret(rc, "cache-cert", cert, key, ca.PEM)
	fw.Create(t, owners)
	rc = pluginCluster(t, ns, vc.Name, "database/creds/"+ns+".cache", framework.Replicas(2), withCertificate("cache-cert"))

	svc := &corev1.Service{}
	if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), svc); err != nil {
		t.Fatal(err)
	}
	cert, key, sn := issue(t, ca, rc, net.ParseIP(svc.Spec.ClusterIP))
	owners.Data[corev1.TLSCertKey], owners.Data[corev1.TLSPrivateKeyKey] = cert, key
	if err := fw.Client.Update(context.Background(), owners); err != nil {
		t.Fatal(err)
	}
	conf := render.ClientTLS(rc, ca.PEM)
	pods := fw.RedisPods(t, rc)
	framework.Eventually(t, 4*time.Minute, func() string {
		for _, p := range pods {
			served, err := redisnode.ServedCertificate(context.Background(), framework.PodAddr(&p), conf)
			if err != nil || served.SerialNumber.Cmp(sn) != 0 {
				return fmt.Sprintf("%s does not serve the certificate with the Service's address yet (%v)", p.Name, err)
			}
		}
		return ""
	})

	pointVaultAt(t, rc, "vault-plugin-tls")
	vaultConfigured(t, rc)
	cur := fw.WaitReady(t, rc, 2*time.Minute)
	user, pass, _ := fw.Credentials(cur)
	for _, p := range pods {
		if !acceptsTLS(framework.PodAddr(&p), conf, user, pass) {
			t.Fatalf("pod %s does not accept the user Vault created on the primary over TLS", p.Name)
		}
	}
	if err := fw.Ground.Vault.Root.Sys().Revoke(cur.Status.Credential.Lease.LeaseID); err != nil {
		t.Fatal(err)
	}
	// Vault deletes the user on the primary as it revokes the lease, before keyroll looks.
	if acceptsTLS(framework.PodAddr(&pods[0]), conf, user, pass) {
		t.Error("the primary still accepts the user right after vault lease revoke: Vault did not delete it over TLS")
	}
}

// TestTLSClientCertificatesRequired: with clientAuth Required, a cluster whose certificate is the
// owner's runs with every client showing a certificate of the owner's CA: keyroll (its users on
// every node, the checks), the probes and the replicas show the nodes' own and the cluster becomes
// Ready; an application with a client certificate of that CA logs in as the credential's user and
// writes; a TLS client without one is refused.
func TestTLSClientCertificatesRequired(t *testing.T) {
	ns := fw.Namespace(t, "tlsclients")
	ca := newTestCA(t)
	rc, _ := tlsCluster(t, ns, "cache", ca, framework.Replicas(2), func(rc *v1beta1.RedisCluster) {
		rc.Spec.TLS = &v1beta1.TLSSpec{CertificateSecretRef: &v1beta1.LocalSecretReference{Name: "cache-cert"}, ClientAuth: v1beta1.TLSClientAuthRequired}
	})
	rc = fw.WaitReady(t, rc, 4*time.Minute)
	user, pass, _ := fw.Credentials(rc)
	pods := fw.RedisPods(t, rc)
	appCert, appKey, err := ca.IssueClient("cache-app")
	if err != nil {
		t.Fatal(err)
	}
	withCert := render.NodeClientTLS(rc, map[string][]byte{"ca.crt": ca.PEM, corev1.TLSCertKey: appCert, corev1.TLSPrivateKeyKey: appKey})
	primary := framework.RedisClientTLS(framework.PodAddr(&pods[0]), user, pass, withCert)
	defer primary.Close()
	if err := primary.Set(context.Background(), "tls:clients", "v", 0).Err(); err != nil {
		t.Fatalf("an application with a certificate of the owner's CA: %v", err)
	}
	for _, p := range pods {
		if acceptsTLS(framework.PodAddr(&p), render.ClientTLS(rc, ca.PEM), user, pass) {
			t.Errorf("%s let in a TLS client without a certificate", p.Name)
		}
		if !acceptsTLS(framework.PodAddr(&p), withCert, user, pass) {
			t.Errorf("%s refused the credential's user with a client certificate", p.Name)
		}
	}
}
