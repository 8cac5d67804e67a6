package main

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// fairListener accepts every connection at once and closes at once each one over its caps: at
// most perSource connections open from one remote address, and total in all. A flood from one
// address thus uses up that address's slots only, and never holds another address's connection
// in the kernel's accept queue.
type fairListener struct {
	net.Listener
	total, perSource int
	log              *slog.Logger

	mu       sync.Mutex
	open     int
	bySource map[netip.Addr]int
	refused  int       // connections refused since the last line that said so
	logged   time.Time // when that line was written
}

// admit serves at most total connections from l at once, at most perSource from one address.
func admit(l net.Listener, total, perSource int, log *slog.Logger) net.Listener {
	return &fairListener{Listener: l, total: total, perSource: perSource, log: log, bySource: map[netip.Addr]int{}}
}

func (l *fairListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := source(c)
		if l.take(src) {
			return &slotConn{Conn: c, release: func() { l.release(src) }}, nil
		}
		if tcp, ok := c.(*net.TCPConn); ok {
			_ = tcp.SetLinger(0) // a reset: a refused connection leaves no TIME_WAIT behind
		}
		_ = c.Close()
	}
}

// take takes a slot for a connection from src, unless src or the listener has none left. It
// counts refusals and says how many there were at most once a minute.
func (l *fairListener) take(src netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open < l.total && l.bySource[src] < l.perSource {
		l.open++
		l.bySource[src]++
		return true
	}
	l.refused++
	if now := time.Now(); now.Sub(l.logged) >= time.Minute {
		l.log.Info("Refusing connections over the caps", "refused", l.refused, "source", src,
			"perSource", l.perSource, "total", l.total)
		l.refused, l.logged = 0, now
	}
	return false
}

func (l *fairListener) release(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	l.bySource[src]--
	if l.bySource[src] == 0 {
		delete(l.bySource, src)
	}
}

// source is the remote address of c, IPv4 ones in their 4-byte form.
func source(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// slotConn is an admitted connection, which gives its slot back once, when it is first closed.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
