package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// TestMetricsNeedAuthorisation runs the manager binary as deploy/default installs it (its service
// account, its RBAC, secure metrics by default) against the real API server, and reads /metrics
// over HTTPS, verifying the serving certificate given with --metrics-cert-dir: a token bound to
// keyroll-metrics-reader gets the metrics (200), another service account's token is forbidden
// (403), no token is unauthorised (401). With --metrics-secure=false the same endpoint is plain
// HTTP, for local use.
func TestMetricsNeedAuthorisation(t *testing.T) {
	ctx := context.Background()
	apply(t, render(t, "default"))
	cp := fw.Ground.CP
	monitoring := fw.Namespace(t, "monitoring")
	for _, sa := range []string{"scraper", "stranger"} {
		if err := cp.EnsureServiceAccount(ctx, monitoring, sa); err != nil {
			t.Fatal(err)
		}
	}
	if err := cp.BindClusterRole(ctx, "keyroll-metrics-reader", monitoring, "scraper"); err != nil {
		t.Fatal(err)
	}
	token := func(ns, name string) string {
		tok, err := cp.ServiceAccountToken(ctx, ns, name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	scraper, stranger := token(monitoring, "scraper"), token(monitoring, "stranger")

	dir := t.TempDir()
	bin, err := framework.BuildOperator(dir)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := serviceAccountKubeconfig(t, dir, token("keyroll-system", "keyroll-manager"))
	certDir := filepath.Join(dir, "certs")
	pool := servingCert(t, certDir)

	port, err := testground.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	mgr := startManager(t, dir, "manager-secure", bin, kubeconfig, port, "--metrics-cert-dir="+certDir)
	url := fmt.Sprintf("https://127.0.0.1:%d/metrics", port)
	httpsClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	status, body := waitScrape(t, mgr, httpsClient, url, scraper)
	if status != http.StatusOK || !strings.Contains(body, "controller_runtime_") {
		t.Errorf("a token bound to keyroll-metrics-reader: %d\n%.300s", status, body)
	}
	if status, body := scrapeWith(t, httpsClient, url, stranger); status != http.StatusForbidden || strings.Contains(body, "controller_runtime_") {
		t.Errorf("a token without keyroll-metrics-reader: %d, want 403\n%.300s", status, body)
	}
	if status, body := scrapeWith(t, httpsClient, url, ""); status != http.StatusUnauthorized || strings.Contains(body, "controller_runtime_") {
		t.Errorf("no token: %d, want 401\n%.300s", status, body)
	}
	// A token the API server does not know is refused too (controller-runtime answers 500 when the
	// TokenReview finds it invalid).
	if status, body := scrapeWith(t, httpsClient, url, "not-a-token"); status == http.StatusOK || strings.Contains(body, "controller_runtime_") {
		t.Errorf("an invalid token: %d\n%.300s", status, body)
	}
	if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port)); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(b), "controller_runtime_") {
			t.Errorf("plain HTTP to the secure endpoint: %d", resp.StatusCode)
		}
	}
	mgr.Stop()
	logs, _ := os.ReadFile(mgr.LogPath)
	for _, secret := range []string{scraper, stranger} {
		if strings.Contains(string(logs), secret) {
			t.Error("the manager logged a scraper's token")
		}
	}

	// --metrics-secure=false: plain HTTP, no token needed.
	plainPort, err := testground.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	plain := startManager(t, dir, "manager-plain", bin, kubeconfig, plainPort, "--metrics-secure=false")
	status, body = waitScrape(t, plain, &http.Client{Timeout: 10 * time.Second}, fmt.Sprintf("http://127.0.0.1:%d/metrics", plainPort), "")
	if status != http.StatusOK || !strings.Contains(body, "controller_runtime_") {
		t.Errorf("--metrics-secure=false without a token: %d\n%.300s", status, body)
	}
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates with a service-account token.
func serviceAccountKubeconfig(t *testing.T, dir, token string) string {
	t.Helper()
	cfg := fw.Ground.CP.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["ground"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["manager"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["manager"] = &clientcmdapi.Context{Cluster: "ground", AuthInfo: "manager"}
	kc.CurrentContext = "manager"
	path := filepath.Join(dir, "manager.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// servingCert writes a self-signed certificate for 127.0.0.1 as tls.crt and tls.key into dir, and
// returns a pool that trusts it.
func servingCert(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	crt, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), crt, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(crt) {
		t.Fatal("no certificate in the generated PEM")
	}
	return pool
}

func startManager(t *testing.T, dir, name, bin, kubeconfig string, metricsPort int, extra ...string) *testground.Process {
	t.Helper()
	args := append([]string{"--kubeconfig=" + kubeconfig, "--leader-elect=false",
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort), "--health-probe-bind-address=127.0.0.1:0",
		"--service-account-namespace=" + fw.OperatorNS, "--zap-log-level=debug", "--redis-probe-image=" + testground.ProbeImage,
		"--webhook-port=0", // no conversion webhook: not what these tests are about
		// On a shared ground, the RedisClusters and VaultConnections of this package alone.
		"--watch-selector=" + fw.Selector().String()}, extra...)
	p, err := testground.StartProcess(dir, name, bin, args, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// waitScrape scrapes until the endpoint answers (the manager is starting).
func waitScrape(t *testing.T, p *testground.Process, c *http.Client, url, token string) (int, string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		status, body, err := scrape(c, url, token)
		if err == nil {
			return status, body
		}
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("the manager's metrics endpoint %s does not answer: %v\n%s", url, err, p.Tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func scrapeWith(t *testing.T, c *http.Client, url, token string) (int, string) {
	t.Helper()
	status, body, err := scrape(c, url, token)
	if err != nil {
		t.Fatal(err)
	}
	return status, body
}

func scrape(c *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
