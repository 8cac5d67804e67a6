package render

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/test/testground"
)

func tlsTestCluster() *v1beta1.RedisCluster {
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	rc.Spec.TLS = &v1beta1.TLSSpec{CertificateSecretRef: &v1beta1.LocalSecretReference{Name: "orders-cert"}}
	return rc
}

func testCA(t *testing.T) *testground.TestCA {
	t.Helper()
	ca, err := testground.NewTestCA("render test CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issueFor(t *testing.T, ca *testground.TestCA, names ...string) (cert, key []byte, sn *big.Int) {
	t.Helper()
	cert, key, sn, err := ca.IssueServer(names)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key, sn
}

// writeTLS puts a certificate, its key and the CA where a pod of root mounts keyroll's <name>-tls
// Secret, each file replaced whole (as the kubelet swaps a Secret volume's files).
func writeTLS(t *testing.T, root string, cert, key, ca []byte) {
	t.Helper()
	dir := filepath.Join(root, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{TLSCertKey: cert, TLSKeyKey: key, CAKey: ca} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// A primary and a replica of a TLS cluster as pods run them: Redis takes no plaintext connection,
// the replica finds the primary (the start script asks its peers over TLS) and replicates over
// TLS, the probe sidecar checks both over TLS (the replica Ready only once synced), the app user
// works over TLS with the CA of the credentials Secret; then a renewed certificate, put in place
// of the old files, is served to new connections once keyroll's admin user tells Redis to read
// the files again, and a connection opened before goes on.
func TestTLSPodsReplicateProbeAndReloadTheirCertificate(t *testing.T) {
	for _, auth := range []v1beta1.TLSClientAuth{v1beta1.TLSClientAuthNone, v1beta1.TLSClientAuthRequired} {
		t.Run("clientAuth "+string(auth), func(t *testing.T) { tlsPods(t, auth) })
	}
}

// tlsPods is TestTLSPodsReplicateProbeAndReloadTheirCertificate with clientAuth auth: with
// Required, the replica replicates, the start script asks and the probe checks with the node's
// certificate as their client certificate, and a client without one is refused.
func tlsPods(t *testing.T, auth v1beta1.TLSClientAuth) {
	rc := tlsTestCluster()
	rc.Spec.TLS.ClientAuth = auth
	rc.Spec.Credentials.ACLRules = []string{"~app:*", "+@read", "+@write"}
	ca := testCA(t)
	cert, key, first := issueFor(t, ca, TLSNodeNames(rc)...)
	in := Internal{Admin: "admin-pw", Replication: "repl-pw", Probe: "probe-pw"}
	app := &Credential{Username: "V_ORDERS_A", Password: "pass-a"}
	acl := aclOf(t, rc, in, app)
	roots := []string{t.TempDir(), t.TempDir()}
	for _, r := range roots {
		writeTLS(t, r, cert, key, ca.PEM)
	}
	primary := startPodIn(t, rc, acl, "orders-0", nil, roots[0], nil, "")
	within(t, 10*time.Second, "the primary is Ready", primary.ready, primary.out, &primary.probeOut)
	replica := startPodIn(t, rc, acl, "orders-1", primary, roots[1], nil, "")
	within(t, 30*time.Second, "the replica is Ready", replica.ready, primary.out, replica.out, &replica.probeOut)
	// The script's output is still being written: its choice is read from the file it wrote.
	if conf, _ := os.ReadFile(filepath.Join(roots[1], "run", "runtime.conf")); !strings.Contains(string(conf), fmt.Sprintf("replicaof 127.0.0.1 %d", primary.port)) {
		t.Errorf("the replica's start script did not find the primary over TLS: runtime.conf has no replicaof line for port %d", primary.port)
	}
	for _, p := range []*pod{primary, replica} {
		if _, err := testground.RedisDo(p.addr(), AdminUser, in.Admin, "PING"); err == nil {
			t.Errorf("%s answers a plaintext client", p.addr())
		}
	}

	conf := NodeClientTLS(rc, map[string][]byte{CAKey: ca.PEM, TLSCertKey: cert, TLSKeyKey: key})
	if auth == v1beta1.TLSClientAuthRequired {
		bare := redisnode.New(primary.addr(), AdminUser, in.Admin, ClientTLS(rc, ca.PEM))
		if _, err := bare.ACLList(context.Background()); err == nil {
			t.Error("clientAuth Required: a client without a certificate was let in")
		}
		_ = bare.Close()
		appCert, appKey, err := ca.IssueClient("orders-app")
		if err != nil {
			t.Fatal(err)
		}
		conf = NodeClientTLS(rc, map[string][]byte{CAKey: ca.PEM, TLSCertKey: appCert, TLSKeyKey: appKey})
	}
	client := func(p *pod) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: p.addr(), Username: app.Username, Password: app.Password, Protocol: 2, DisableIdentity: true, TLSConfig: conf})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ctx := context.Background()
	onPrimary := client(primary)
	if err := onPrimary.Set(ctx, "app:1", "v", 0).Err(); err != nil {
		t.Fatalf("the app user writes over TLS: %v", err)
	}
	within(t, 5*time.Second, "the write reaches the replica over TLS", func() bool {
		v, err := client(replica).Get(ctx, "app:1").Result()
		return err == nil && v == "v"
	})

	cert2, key2, second := issueFor(t, ca, TLSNodeNames(rc)...)
	writeTLS(t, roots[0], cert2, key2, ca.PEM)
	served := func() *big.Int {
		c, err := redisnode.ServedCertificate(ctx, primary.addr(), conf)
		if err != nil {
			t.Fatal(err)
		}
		return c.SerialNumber
	}
	if got := served(); got.Cmp(first) != 0 {
		t.Fatalf("the primary serves %x before it was told to read its files, want %x", got, first)
	}
	admin := redisnode.New(primary.addr(), AdminUser, in.Admin, NodeClientTLS(rc, map[string][]byte{CAKey: ca.PEM, TLSCertKey: cert2, TLSKeyKey: key2}))
	defer admin.Close()
	var files []string
	for _, a := range TLSReloadArgs() {
		files = append(files, primary.relocate.Replace(a))
	}
	if err := admin.ReloadCertificate(ctx, files); err != nil {
		t.Fatalf("CONFIG SET as keyroll's admin user: %v", err)
	}
	if got := served(); got.Cmp(second) != 0 {
		t.Errorf("the primary serves %x after the reload, want %x", got, second)
	}
	if err := onPrimary.Get(ctx, "app:1").Err(); err != nil {
		t.Errorf("the connection opened before the reload: %v", err)
	}
	within(t, 5*time.Second, "the primary stays Ready", primary.ready, &primary.probeOut)
	noTLS := redisnode.New(primary.addr(), AdminUser, in.Admin, &tls.Config{ServerName: TLSServerName(rc), MinVersion: tls.VersionTLS12})
	defer noTLS.Close()
	if _, err := noTLS.ACLList(ctx); err == nil {
		t.Error("a client that does not trust the cluster's CA was let in")
	}
}

// CheckCertificate takes a certificate that serves every name of the cluster, signed by the CA
// given, with its own key; it refuses each other case and says which, without a byte of the key.
func TestCheckCertificateRefusesWhatCannotServe(t *testing.T) {
	rc := tlsTestCluster()
	ca, other := testCA(t), testCA(t)
	cert, key, sn := issueFor(t, ca, TLSNodeNames(rc)...)
	leaf, err := CheckCertificate(rc, cert, key, ca.PEM, time.Now())
	if err != nil || leaf.SerialNumber.Cmp(sn) != 0 {
		t.Fatalf("a good certificate: %v, %v", leaf, err)
	}
	onlyService, onlyServiceKey, _ := issueFor(t, ca, TLSServerName(rc))
	serverOnly, serverOnlyKey, _, err := ca.IssueServerOnly(TLSNodeNames(rc))
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, _ := issueFor(t, ca, TLSNodeNames(rc)...)
	for name, c := range map[string]struct {
		cert, key, ca []byte
		at            time.Time
		want          string
	}{
		"another CA":                       {cert, key, other.PEM, time.Now(), "unknown authority"},
		"another key":                      {cert, otherKey, ca.PEM, time.Now(), "not a certificate and its private key"},
		"no node name":                     {onlyService, onlyServiceKey, ca.PEM, time.Now(), "orders-0.orders-headless.shop.svc"},
		"expired":                          {cert, key, ca.PEM, time.Now().Add(48 * time.Hour), "expired"},
		"no CA":                            {cert, key, nil, time.Now(), "ca.crt holds no PEM certificate"},
		"the key where the certificate":    {key, key, ca.PEM, time.Now(), "not a certificate and its private key"},
		"server only, clientAuth Required": {serverOnly, serverOnlyKey, ca.PEM, time.Now(), "usage client auth"},
	} {
		rc := rc
		if name == "server only, clientAuth Required" {
			rc = tlsTestCluster()
			rc.Spec.TLS.ClientAuth = v1beta1.TLSClientAuthRequired
		}
		_, err := CheckCertificate(rc, c.cert, c.key, c.ca, c.at)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), string(key[40:60])) {
			t.Errorf("%s: the error shows the key", name)
		}
	}
}

// A cluster without TLS renders as before spec.tls existed (its pods are not restarted by an
// upgrade: TestDataPlaneVersionNamesTheTemplate holds the hash); with TLS, Redis listens with TLS
// only, replicates over TLS, and the pods mount keyroll's copy of the certificate.
func TestTLSClusterRendersTLSOnly(t *testing.T) {
	rc := tlsTestCluster()
	conf := ConfigMap(rc).Data["redis.conf"]
	for _, want := range []string{"port 0\n", "tls-port 6379\n", "tls-replication yes\n", "tls-auth-clients no\n", "tls-cert-file /etc/keyroll/tls/tls.crt\n"} {
		if !strings.Contains(conf, want) {
			t.Errorf("redis.conf lacks %q:\n%s", want, conf)
		}
	}
	if !strings.Contains(ConfigMap(rc).Data["start.sh"], "--tls --cacert /etc/keyroll/tls/ca.crt --cert /etc/keyroll/tls/tls.crt --key /etc/keyroll/tls/tls.key --sni orders.shop.svc") {
		t.Error("the start script's peer query does not use TLS")
	}
	spec := StatefulSet(rc, "v", testProbeImage).Spec.Template.Spec
	mounted := 0
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		for _, m := range c.VolumeMounts {
			if m.Name == "tls" {
				mounted++
			}
		}
	}
	if mounted != 2 {
		t.Errorf("the tls volume is mounted in %d containers, want Redis and the probe sidecar", mounted)
	}
	if probe := strings.Join(spec.InitContainers[0].Command, " "); !strings.Contains(probe, "--tls-server-name=orders.shop.svc") {
		t.Errorf("the probe sidecar does not check the certificate: %s", probe)
	}
	rc.Spec.TLS = nil
	if conf := ConfigMap(rc).Data["redis.conf"]; strings.Contains(conf, "tls") || !strings.Contains(conf, "port 6379\n") {
		t.Errorf("redis.conf of a cluster without TLS:\n%s", conf)
	}
}
