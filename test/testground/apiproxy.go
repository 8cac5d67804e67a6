package testground

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
)

// APIFault is what an APIProxy does with one request that its rule picks.
type APIFault int

const (
	// PassThrough forwards the request and its answer.
	PassThrough APIFault = iota
	// FailAfterCommit forwards the request (the API server commits it) and answers 500.
	FailAfterCommit
	// TimeoutAfterCommit forwards the request and answers 504 Timeout, as the API server does when
	// a request outlives its deadline after etcd took it.
	TimeoutAfterCommit
	// FailBeforeCommit answers 500 without forwarding.
	FailBeforeCommit
)

// APIProxy is an HTTPS proxy in front of the ground's API server, for a client (the operator as
// a process) that a test wants to see API faults: a rule picks requests (by method, path and body)
// and fails them before or after the API server commits them. It authenticates to the API server
// as the ground's admin; its clients need no credentials of their own.
type APIProxy struct {
	// Kubeconfig is a kubeconfig file for the proxy.
	Kubeconfig string
	srv        *http.Server
	ln         net.Listener

	mu   sync.Mutex
	rule func(method, path string, body []byte) APIFault
}

// StartAPIProxy starts a proxy on a free loopback port, passing everything through until SetRule.
func (cp *ControlPlane) StartAPIProxy(dir string) (*APIProxy, error) {
	target, err := url.Parse(cp.Config.Host)
	if err != nil {
		return nil, err
	}
	rt, err := rest.TransportFor(cp.Config)
	if err != nil {
		return nil, err
	}
	crt, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return nil, err
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	p := &APIProxy{ln: ln}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport, rp.FlushInterval = rt, -1 // watches stream
	p.srv = &http.Server{Handler: p.handler(rp), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()

	kc := clientcmdapi.NewConfig()
	kc.Clusters["proxy"] = &clientcmdapi.Cluster{Server: "https://" + ln.Addr().String(), CertificateAuthorityData: crt}
	kc.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	kc.CurrentContext = "proxy"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p.Kubeconfig = filepath.Join(dir, fmt.Sprintf("apiproxy-%d.kubeconfig", ln.Addr().(*net.TCPAddr).Port))
	if err := clientcmd.WriteToFile(*kc, p.Kubeconfig); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// SetRule sets the rule that picks the requests to fail (nil: none).
func (p *APIProxy) SetRule(rule func(method, path string, body []byte) APIFault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rule = rule
}

func (p *APIProxy) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		rule := p.rule
		p.mu.Unlock()
		fault := PassThrough
		if rule != nil && r.Body != nil && r.Method != http.MethodGet {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			fault = rule(r.Method, r.URL.Path, body)
		}
		switch fault {
		case FailBeforeCommit:
			apiError(w, http.StatusInternalServerError, "InternalError")
		case FailAfterCommit:
			next.ServeHTTP(discard{}, r)
			apiError(w, http.StatusInternalServerError, "InternalError")
		case TimeoutAfterCommit:
			next.ServeHTTP(discard{}, r)
			apiError(w, http.StatusGatewayTimeout, "Timeout")
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// apiError answers as the API server does with a failure Status.
func apiError(w http.ResponseWriter, code int, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"injected by the test ground's API proxy","reason":%q,"code":%d}`, reason, code)
}

// Stop closes the proxy and every connection through it.
func (p *APIProxy) Stop() { _ = p.srv.Close() }

// discard is a ResponseWriter that throws the answer away.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}
