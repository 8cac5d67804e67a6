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
// file at each probe.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/keyroll/keyroll/redisnode"
)

func main() {
	var (
		listen   = flag.String("listen-address", ":8081", "Address the /ready and /live endpoints bind to.")
		redis    = flag.String("redis-address", "127.0.0.1:6379", "The Redis node to probe.")
		user     = flag.String("user", "keyroll-probe", "The ACL user the probes authenticate as.")
		passFile = flag.String("password-file", "/etc/keyroll/acl/probe-password", "File holding the user's password, read at each probe.")
		timeout  = flag.Duration("timeout", 2*time.Second, "How long one probe waits for Redis; keep it below the kubelet's probe timeout.")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	p := &prober{redis: *redis, user: *user, passwordFile: *passFile, timeout: *timeout, log: log}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, *listen, p.handler()); err != nil {
		log.Error("Serving probes", "error", err)
		os.Exit(1)
	}
}

// serve answers on addr until ctx ends.
func serve(ctx context.Context, addr string, h http.Handler) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
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

// prober checks one Redis node and logs when a verdict changes.
type prober struct {
	redis, user, passwordFile string
	timeout                   time.Duration
	log                       *slog.Logger

	mu   sync.Mutex
	last map[string]string // the last verdict of each check: "" passed, else why not
}

type check func(ctx context.Context, addr, username, password string) error

func (p *prober) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", p.serve("ready", redisnode.Ready))
	mux.HandleFunc("GET /live", p.serve("live", redisnode.Alive))
	return mux
}

func (p *prober) serve(name string, c check) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := p.run(r.Context(), c)
		p.note(name, err)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	}
}

func (p *prober) run(ctx context.Context, c check) error {
	pw, err := os.ReadFile(p.passwordFile)
	if err != nil {
		return fmt.Errorf("reading the probe user's password: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	return c(ctx, p.redis, p.user, strings.TrimRight(string(pw), "\n"))
}

// note logs a check whose verdict changed (the first one too, when it fails).
func (p *prober) note(name string, err error) {
	why := ""
	if err != nil {
		why = err.Error()
	}
	p.mu.Lock()
	before, seen := p.last[name]
	if p.last == nil {
		p.last = map[string]string{}
	}
	p.last[name] = why
	p.mu.Unlock()
	switch {
	case seen && before == why:
	case err != nil:
		p.log.Info("Probe fails", "probe", name, "reason", why)
	case seen:
		p.log.Info("Probe passes", "probe", name)
	}
}
