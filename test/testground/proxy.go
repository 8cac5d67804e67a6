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

	mu  sync.Mutex
	cut bool
	// blackhole: connections are accepted and held, never answered nor forwarded.
	blackhole bool
	conns     map[net.Conn]struct{}
	// accepted counts the connections accepted, whatever became of them.
	accepted int
	wg       sync.WaitGroup
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

// Blackhole drops every open connection; new ones are accepted and then never answered (a
// server that hangs rather than refuses), until Restore.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole = true
	for c := range p.conns {
		c.Close()
	}
}

// Restore lets connections through again; held connections are closed.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole {
		for c := range p.conns {
			c.Close()
		}
	}
	p.cut, p.blackhole = false, false
}

// Accepted is how many connections the proxy has accepted, refused and held ones included: the
// connection attempts made through it.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
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
		p.accepted++
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		if p.blackhole {
			p.mu.Unlock()
			continue // held until Restore or Stop closes it
		}
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
