// Command keyroll-probe answers the kubelet's probes of a Redis pod over HTTP, so that probing a
// Redis node costs the node an HTTP request and one short Redis connection rather than a process
// started in the Redis container (an exec probe, which on a busy node costs a fraction of a CPU
// second each time). It runs beside Redis in every pod keyroll makes, as a sidecar of the manager's
// image, and asks Redis over the pod's loopback as the probe user:
//
//	GET /ready  200 once Redis serves its data (loaded; a replica linked and synced), else 503
//	GET /live   200 while Redis answers (PONG, LOADING, MASTERDOWN), else 503
//
// A 503's body says why, in Redis's words; it never holds the password, which is read from its
// file at each check.
//
// It holds under a flood of connections (any pod may reach it unless a NetworkPolicy keeps them
// out), and the kubelet's probes do not wait behind it: it listens on the pod's IP only (the
// address the kubelet probes), accepts every connection at once and closes at once each one over
// its caps (a few open at once from one remote address, a few hundred in all), so that a flood from
// one address uses up that address's slots only and the kubelet, probing from the node's address,
// never queues behind it. A connection that is slow to send its request is closed within seconds;
// one Redis check of each kind runs at a time, whose verdict answers every request for a second;
// each request has a deadline.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/keyroll/keyroll/redisnode"
)

func main() {
	var (
		listenIP = flag.String("listen-ip", "", "IP address the /ready and /live endpoints bind to: the pod's IP, which the kubelet probes; empty: every address.")
		port     = flag.Int("port", 8081, "Port of the /ready and /live endpoints.")
		maxConns = flag.Int("max-connections", 256, "How many connections are served at once, from all addresses; one more is closed at once.")
		perSrc   = flag.Int("max-connections-per-source", 4, "How many connections from one remote address are served at once; one more is closed at once. The kubelet probes from the node's address.")
		redis    = flag.String("redis-address", "127.0.0.1:6379", "The Redis node to probe.")
		user     = flag.String("user", "keyroll-probe", "The ACL user the probes authenticate as.")
		passFile = flag.String("password-file", "/etc/keyroll/acl/probe-password", "File holding the user's password, read at each check.")
		timeout  = flag.Duration("timeout", 2*time.Second, "How long one check waits for Redis; keep it below the kubelet's probe timeout.")
		fresh    = flag.Duration("verdict-ttl", time.Second, "How long a check's verdict answers further requests; keep it well below the probes' period.")
		caFile   = flag.String("tls-ca-file", "", "With TLS: file holding the CA bundle the node's certificate is checked against, read at each check; empty: no TLS.")
		tlsName  = flag.String("tls-server-name", "", "With TLS: the name the node's certificate must carry.")
		certFile = flag.String("tls-cert-file", "", "With TLS: a certificate to show the node when it asks for one (tls-auth-clients), read at each check.")
		keyFile  = flag.String("tls-key-file", "", "With TLS: the key of --tls-cert-file.")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	p := &prober{redis: *redis, user: *user, passwordFile: *passFile, caFile: *caFile, serverName: *tlsName, certFile: *certFile, keyFile: *keyFile, timeout: *timeout, fresh: *fresh, log: log,
		ready: redisnode.Ready, live: redisnode.Alive}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	l, err := net.Listen("tcp", net.JoinHostPort(*listenIP, strconv.Itoa(*port)))
	if err == nil {
		err = serve(ctx, admit(l, *maxConns, *perSrc, log), p)
	}
	if err != nil {
		log.Error("Serving probes", "error", err)
		os.Exit(1)
	}
}

// serve answers on l until ctx ends.
func serve(ctx context.Context, l net.Listener, p *prober) error {
	srv := p.server()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// server is the HTTP server of p's endpoints: a request that is slow to arrive or to be read
// gives up its connection, and an idle connection is closed soon.
func (p *prober) server() *http.Server {
	return &http.Server{Handler: p.handler(), ReadHeaderTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second,
		WriteTimeout: p.timeout + 2*time.Second, IdleTimeout: 5 * time.Second, MaxHeaderBytes: 4 << 10}
}

// prober checks one Redis node and logs when a verdict changes.
type prober struct {
	redis, user, passwordFile string
	// caFile, when set, makes each check connect with TLS, checking the certificate against the
	// file's CA bundle (read at each check: the kubelet replaces it in place) for serverName.
	caFile, serverName string
	// certFile and keyFile, when set, are the certificate each check shows the node.
	certFile, keyFile string
	// timeout bounds one check; fresh is how long its verdict answers further requests.
	timeout, fresh time.Duration
	log            *slog.Logger
	// ready and live are the checks of /ready and /live.
	ready, live check

	checks singleflight.Group
	mu     sync.Mutex
	last   map[string]verdict // the last verdict of each check
}

// verdict is one check's outcome: nil passed, else why not.
type verdict struct {
	err error
	at  time.Time
}

type check func(ctx context.Context, addr, username, password string, tlsConf *tls.Config) error

func (p *prober) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", p.serve("ready", p.ready))
	mux.HandleFunc("GET /live", p.serve("live", p.live))
	return mux
}

func (p *prober) serve(name string, c check) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), p.timeout+time.Second)
		defer cancel()
		err := p.verdict(ctx, name, c)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	}
}

// verdict is the check's verdict: the last one while it is fresh, else that of a new check, which
// every request arriving meanwhile waits for (one check of a kind runs at a time).
func (p *prober) verdict(ctx context.Context, name string, c check) error {
	p.mu.Lock()
	v, ok := p.last[name]
	p.mu.Unlock()
	if ok && time.Since(v.at) < p.fresh {
		return v.err
	}
	ch := p.checks.DoChan(name, func() (any, error) {
		err := p.run(c)
		p.note(name, err)
		return nil, err
	})
	select {
	case res := <-ch:
		return res.Err
	case <-ctx.Done():
		return fmt.Errorf("no verdict within the request's deadline: %w", ctx.Err())
	}
}

// run checks Redis once, within p.timeout.
func (p *prober) run(c check) error {
	pw, err := os.ReadFile(p.passwordFile)
	if err != nil {
		return fmt.Errorf("reading the probe user's password: %w", err)
	}
	tlsConf, err := p.tls()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	return c(ctx, p.redis, p.user, strings.TrimRight(string(pw), "\n"), tlsConf)
}

// tls is the TLS configuration of a check: nil without a CA file.
func (p *prober) tls() (*tls.Config, error) {
	if p.caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(p.caFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the CA bundle %s holds no certificate", p.caFile)
	}
	c := &tls.Config{RootCAs: pool, ServerName: p.serverName, MinVersion: tls.VersionTLS12}
	if p.certFile != "" {
		pair, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
		if err != nil {
			return nil, fmt.Errorf("reading the client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// note keeps a check's verdict, and logs it when it changed (the first one too, when it fails).
func (p *prober) note(name string, err error) {
	why := ""
	if err != nil {
		why = err.Error()
	}
	p.mu.Lock()
	before, seen := p.last[name]
	if p.last == nil {
		p.last = map[string]verdict{}
	}
	p.last[name] = verdict{err: err, at: time.Now()}
	p.mu.Unlock()
	beforeWhy := ""
	if before.err != nil {
		beforeWhy = before.err.Error()
	}
	switch {
	case seen && beforeWhy == why:
	case err != nil:
		p.log.Info("Probe fails", "probe", name, "reason", why)
	case seen:
		p.log.Info("Probe passes", "probe", name)
	}
}
