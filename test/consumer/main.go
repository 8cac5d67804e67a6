// Command consumer is a Redis client for the test ground's real node: it stands for an application
// that uses a RedisCluster's credential, so that tests can prove that a rotation drops no command.
//
// It reads the username and password from files (a mounted Secret; read again whenever they
// change), runs SET then GET of its own key against a Redis address continuously, reconnects
// after a failure, and counts commands that succeeded and failed, the longest outage (from a
// failure to the next success) and lost writes (a GET older than the last acknowledged SET). Its counters are served as JSON
// on /stats, and it logs one line per failure (never the password). On SIGTERM it finishes the
// command in flight, stops, and writes its final counters as JSON to -final (the pod's
// termination message, which the kubelet reports in the pod's status), so that a test counts the
// commands of a pod a rollout replaced too.
//
// Flags: -redis host:port (required), -credentials DIR (files username and password; default
// /etc/consumer/credentials), -listen host:port (default :8080; in a pod, $(POD_IP):8080),
// -interval (default 100ms), -timeout (each command's, and the dial's; default 5s, as common
// clients have it: a machine under load may stall a reply for a second or two), -key (default
// consumer:$HOSTNAME), -final FILE (default /dev/termination-log; empty: none), -linger (how long
// it goes on after SIGTERM, as an application that drains its work does; default 0), -tls (connect
// with TLS 1.2 or newer; the server certificate is always verified), -tls-ca FILE (the PEM CA
// bundle that certificate must chain to, read again at each connection, so that a changed bundle
// in the mounted Secret is taken at the next one; default ca.crt in -credentials, with
// -credentials-env too), -tls-server-name (the name the certificate must carry; default the host
// of -redis).
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/keyroll/keyroll/test/consumer/stats"
)

// maxFailures failures (Stats.Failures) of at most maxReason bytes each keep the final counters
// well inside the 4,096 bytes the kubelet keeps of a termination message.
const (
	maxFailures = 12
	maxReason   = 160
)

type consumer struct {
	addr, dir, key    string
	interval, timeout time.Duration
	// useTLS connects with TLS, verifying the server certificate against the CA bundle caFile
	// for serverName (empty: the host of addr).
	useTLS             bool
	caFile, serverName string

	mu    sync.Mutex
	stats stats.Stats

	user, pass string
	// fromEnv takes the credential from the environment, which a running pod never sees change.
	fromEnv bool
	conn    net.Conn
	rd      *bufio.Reader
	// failingSince is when the first of the failures since the last success happened (zero: none).
	failingSince time.Time
}

func main() {
	c := &consumer{}
	host, _ := os.Hostname()
	flag.StringVar(&c.addr, "redis", "", "Redis address host:port (required).")
	flag.StringVar(&c.dir, "credentials", "/etc/consumer/credentials", "Directory with the files username and password.")
	flag.BoolVar(&c.fromEnv, "credentials-env", false, "Take the credential from REDIS_USERNAME and REDIS_PASSWORD, once, as an application configured by env does (-credentials is read only for the default of -tls-ca).")
	flag.BoolVar(&c.useTLS, "tls", false, "Connect with TLS (1.2 or newer), verifying the server certificate against -tls-ca.")
	flag.StringVar(&c.caFile, "tls-ca", "", "PEM CA bundle the server certificate must chain to, read at each connection (default: ca.crt in -credentials).")
	flag.StringVar(&c.serverName, "tls-server-name", "", "Name the server certificate must carry (default: the host of -redis).")
	flag.StringVar(&c.key, "key", "consumer:"+host, "The key this consumer writes and reads.")
	flag.DurationVar(&c.interval, "interval", 100*time.Millisecond, "Pause between two SET/GET rounds.")
	flag.DurationVar(&c.timeout, "timeout", 5*time.Second, "How long a command (or a dial) may take.")
	listen := flag.String("listen", ":8080", "Where /stats is served.")
	final := flag.String("final", "/dev/termination-log", "Where the final counters go on SIGTERM (empty: nowhere).")
	linger := flag.Duration("linger", 0, "How long SET/GET go on after SIGTERM before the consumer stops.")
	flag.Parse()
	if c.addr == "" {
		log.Fatal("consumer: -redis is required")
	}
	if c.caFile == "" {
		c.caFile = filepath.Join(c.dir, "ca.crt")
	}
	http.HandleFunc("/stats", c.serveStats)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("consumer: %v", err)
	}
	go func() { log.Fatal(http.Serve(ln, nil)) }()
	log.Printf("consumer: SET/GET %s against %s every %s (TLS: %t); stats on http://%s/stats", c.key, c.addr, c.interval, c.useTLS, ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *linger > 0 {
		ctx = lingering(ctx, *linger)
	}
	c.loop(ctx)
	c.writeFinal(*final)
}

// lingering ends d after signalled does.
func lingering(signalled context.Context, d time.Duration) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-signalled.Done()
		log.Printf("consumer: signalled; going on for %s", d)
		time.Sleep(d)
		cancel()
	}()
	return ctx
}

// writeFinal writes the counters as JSON to path.
func (c *consumer) writeFinal(path string) {
	b, _ := json.Marshal(c.snapshot())
	log.Printf("consumer: stopped: %s", b)
	if path == "" {
		return
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		log.Printf("consumer: writing the final counters: %v", err)
	}
}

func (c *consumer) serveStats(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c.snapshot())
}

// snapshot is a copy of the counters.
func (c *consumer) snapshot() stats.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Failures = slices.Clone(s.Failures)
	return s
}

// loop runs SET and GET until ctx ends; a failed command closes the connection and the next round
// connects again.
func (c *consumer) loop(ctx context.Context) {
	acked := -1 // the last value a SET of which Redis acknowledged
	for n := 0; ctx.Err() == nil; n++ {
		c.reloadCredentials()
		value := strconv.Itoa(n)
		if c.do("SET", func() error {
			_, err := c.command("SET", c.key, value)
			return err
		}) {
			acked = n
		}
		c.do("GET", func() error {
			got, err := c.command("GET", c.key)
			if err != nil {
				return err
			}
			// A SET that failed may still have been applied: only a value older than the last
			// acknowledged one is a lost write.
			if v, perr := strconv.Atoi(got); acked >= 0 && (perr != nil || v < acked) {
				c.mu.Lock()
				c.stats.LostWrites++
				c.mu.Unlock()
				return fmt.Errorf("GET returned %q, older than the acknowledged %d: a lost write", got, acked)
			}
			if got != value {
				return fmt.Errorf("GET returned %q, want %q", got, value)
			}
			return nil
		})
		time.Sleep(c.interval)
	}
	c.mu.Lock()
	c.closeLocked()
	c.mu.Unlock()
}

// do runs one command (connecting first when needed), counts it, and says whether it succeeded.
func (c *consumer) do(op string, f func() error) bool {
	err := c.ensureConnected()
	if err == nil {
		err = f()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if err == nil {
		c.stats.OK++
		if !c.failingSince.IsZero() {
			c.stats.LongestOutageMs = max(c.stats.LongestOutageMs, now.Sub(c.failingSince).Milliseconds())
			c.failingSince = time.Time{}
		}
		return true
	}
	if c.failingSince.IsZero() {
		c.failingSince = now
	}
	c.stats.Failed++
	c.stats.LastError = err.Error()
	c.stats.LastFailure = now.UTC().Format(time.RFC3339Nano)
	if len(c.stats.Failures) < maxFailures {
		reason := c.stats.LastError
		if len(reason) > maxReason {
			reason = reason[:maxReason]
		}
		c.stats.Failures = append(c.stats.Failures, stats.Failure{At: c.stats.LastFailure, Op: op, User: c.user, Error: reason})
	}
	log.Printf("consumer: failure %d: %s as %q: %v", c.stats.Failed, op, c.user, err)
	c.closeLocked()
	return false
}

// reloadCredentials reads the files; when they changed, the next command connects with them. A
// Secret volume swaps all its files at once by pointing ..data at a new directory: both files are
// read from the directory ..data points at, so that a username is never paired with the password
// of another credential.
func (c *consumer) reloadCredentials() {
	if c.fromEnv {
		c.useCredential(os.Getenv("REDIS_USERNAME"), os.Getenv("REDIS_PASSWORD"))
		return
	}
	base := c.dir
	if snapshot, err := filepath.EvalSymlinks(filepath.Join(c.dir, "..data")); err == nil {
		base = snapshot
	}
	user, err1 := os.ReadFile(filepath.Join(base, "username"))
	pass, err2 := os.ReadFile(filepath.Join(base, "password"))
	if err := errors.Join(err1, err2); err != nil {
		c.mu.Lock()
		c.stats.LastError = "reading the credential: " + err.Error()
		c.mu.Unlock()
		return
	}
	c.useCredential(strings.TrimSpace(string(user)), strings.TrimSpace(string(pass)))
}

// useCredential makes the next command connect with u and p when they are not the ones in use.
func (c *consumer) useCredential(u, p string) {
	if u == c.user && p == c.pass {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.user != "" {
		c.stats.CredentialReloads++
		log.Printf("consumer: credential changed from %q to %q; reconnecting", c.user, u)
	}
	c.user, c.pass, c.stats.User = u, p, u
	c.closeLocked()
}

func (c *consumer) ensureConnected() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		return nil
	}
	if c.user == "" {
		return errors.New("no credential yet")
	}
	conn, err := c.dial()
	if err != nil {
		return err
	}
	c.conn, c.rd = conn, bufio.NewReader(conn)
	if _, err := c.commandLocked("AUTH", c.user, c.pass); err != nil {
		c.closeLocked()
		return fmt.Errorf("AUTH: %w", err)
	}
	c.stats.Connects++
	return nil
}

// dial connects to addr, with TLS when asked. The CA bundle is read at each connection, so that a
// changed ca.crt in the mounted Secret (the kubelet updates it in place) is taken at the next one.
func (c *consumer) dial() (net.Conn, error) {
	d := &net.Dialer{Timeout: c.timeout}
	if !c.useTLS {
		return d.Dial("tcp", c.addr)
	}
	roots, err := readCABundle(c.caFile)
	if err != nil {
		return nil, err
	}
	// The timeout covers the handshake too; an empty ServerName is the host of addr.
	td := &tls.Dialer{NetDialer: d, Config: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: c.serverName}}
	return td.Dial("tcp", c.addr)
}

// readCABundle reads a PEM CA bundle. Its errors name the file, never what it holds.
func readCABundle(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the CA bundle: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("parsing the CA bundle %s: no PEM certificate in it", path)
	}
	return roots, nil
}

func (c *consumer) closeLocked() {
	if c.conn != nil {
		c.conn.Close()
		c.conn, c.rd = nil, nil
	}
}

func (c *consumer) command(args ...string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return "", errors.New("not connected")
	}
	return c.commandLocked(args...)
}

// commandLocked sends one command in RESP and reads a simple string, bulk string or error reply.
func (c *consumer) commandLocked(args ...string) (string, error) {
	_ = c.conn.SetDeadline(time.Now().Add(c.timeout))
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.conn.Write(b.Bytes()); err != nil {
		return "", err
	}
	line, err := c.rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "+"):
		return line[1:], nil
	case strings.HasPrefix(line, "-"):
		return "", errors.New("redis: " + line[1:])
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("redis: unexpected reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("redis: unexpected reply %q", line)
}
