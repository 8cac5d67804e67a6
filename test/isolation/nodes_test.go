package isolation

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/test/testground"
)

// The name prefixes of the three kinds of cluster.
const healthyPrefix, hangingPrefix, refusedPrefix = "healthy-", "hanging-", "refused-"

// redisNodes serves the Redis pods of namespace ns at their pods' IPs on kwok's fake node: a
// healthy cluster's pod by a redis-server with the aclfile keyroll wrote for the cluster, started
// once both exist; a hanging cluster's by a listener that accepts and never answers. Nothing
// serves the other pods: a connection to them is refused. Everything stops when the test ends.
type redisNodes struct {
	dir       string
	bin       string
	mu        sync.Mutex
	served    map[string]bool // pod IPs
	procs     []*testground.Process
	listeners []net.Listener
	conns     []net.Conn
}

func serveRedisNodes(t *testing.T, ns string) *redisNodes {
	t.Helper()
	bin, err := testground.SystemBinary("redis-server", "redis-server")
	if err != nil {
		t.Fatal(err)
	}
	n := &redisNodes{dir: t.TempDir(), bin: bin, served: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			n.serve(ctx, t, ns)
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		n.stop()
	})
	return n
}

// serve starts what the pods that got their IP since the last look need.
func (n *redisNodes) serve(ctx context.Context, t *testing.T, ns string) {
	pods := &corev1.PodList{}
	if err := fw.Client.List(ctx, pods, client.InNamespace(ns), client.HasLabels{v1beta1.LabelCluster}); err != nil {
		return
	}
	for _, p := range pods.Items {
		ip, cluster := p.Status.PodIP, p.Labels[v1beta1.LabelCluster]
		if ip == "" || n.isServed(ip) {
			continue
		}
		var err error
		switch {
		case strings.HasPrefix(cluster, healthyPrefix):
			err = n.startRedis(ctx, ns, cluster, ip)
		case strings.HasPrefix(cluster, hangingPrefix):
			err = n.hang(ip)
		default:
			n.markServed(ip) // nothing listens: refused
		}
		if err != nil {
			t.Logf("serving pod %s at %s: %v", p.Name, ip, err)
		}
	}
}

func (n *redisNodes) isServed(ip string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.served[ip]
}

func (n *redisNodes) markServed(ip string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.served[ip] = true
}

// startRedis starts a redis-server at ip:6379 with the cluster's aclfile, once keyroll wrote it.
func (n *redisNodes) startRedis(ctx context.Context, ns, cluster, ip string) error {
	acl := &corev1.Secret{}
	if err := fw.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: render.ACLSecretName(&v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster}})}, acl); err != nil {
		return client.IgnoreNotFound(err) // not written yet: the pod's container would wait for it too
	}
	file := filepath.Join(n.dir, ip+".acl")
	if err := os.WriteFile(file, acl.Data[render.ACLFileKey], 0o600); err != nil {
		return err
	}
	p, err := testground.StartProcess(n.dir, "redis-"+ip, n.bin, []string{"--bind", ip, "--port", "6379", "--aclfile", file,
		"--save", "", "--appendonly", "no", "--dir", n.dir, "--daemonize", "no"}, nil)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.served[ip] = true
	n.procs = append(n.procs, p)
	return nil
}

// hang listens at ip:6379, accepts every connection and never answers.
func (n *redisNodes) hang(ip string) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "6379"))
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.served[ip] = true
	n.listeners = append(n.listeners, ln)
	n.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.mu.Lock()
			n.conns = append(n.conns, c)
			n.mu.Unlock()
		}
	}()
	return nil
}

func (n *redisNodes) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.procs {
		p.Stop()
	}
	for _, l := range n.listeners {
		_ = l.Close()
	}
	for _, c := range n.conns {
		_ = c.Close()
	}
}
