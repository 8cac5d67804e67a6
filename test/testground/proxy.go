package testground

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
)

// Proxy is a loopback TCP proxy that a test can cut and restore, to stand for a network path
// between the operator and a server (for example Vault) that fails and comes back.
type Proxy struct {
	Host   string
	Port   int
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartProxy forwards 127.0.0.1:<free port> to target (host:port).
func StartProxy(target string) (*Proxy, error) { return StartProxyOn("127.0.0.1", target) }

// StartProxyOn forwards host:<free port> to target; host is a loopback address or the real node's
// bridge address (never a wildcard).
func StartProxyOn(host, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	p := &Proxy{Host: host, Port: ln.Addr().(*net.TCPAddr).Port, target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// URL is http://<host>:<port>.
func (p *Proxy) URL() string {
	return fmt.Sprintf("http://%s", net.JoinHostPort(p.Host, strconv.Itoa(p.Port)))
}

// Cut drops every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Stop closes the proxy and waits for its goroutines.
func (p *Proxy) Stop() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *Proxy) forward(c net.Conn) {
	defer p.wg.Done()
	defer p.forget(c)
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	defer p.forget(up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

func (p *Proxy) forget(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}
