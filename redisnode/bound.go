package redisnode

import (
	"errors"
	"fmt"
	"net"
)

// Every reply keyroll reads from a node is bounded, in size as in time (Timeout): a node is the
// tenant's (its image is spec.image) and its clients are anyone holding a credential (a client
// names its own connection, and CLIENT LIST repeats the name), so a reply may be of any size. The
// bound sits under go-redis, on the connection: go-redis allocates what a reply declares (a bulk
// string's length, an array's count) before the bytes arrive, so each declaration is checked
// against what is left of the bound before go-redis sees it, and a reply over it ends the
// connection after at most MaxReply bytes read.

// MaxReply is the most one reply may hold, in bytes on the wire: CLIENT LIST of a node with
// Redis's default 10,000 clients, at about 300 bytes each, is 3 MB; INFO and ACL LIST are a few KB.
const MaxReply = 8 << 20

// ErrReplyTooLarge is the error of a command whose reply is over MaxReply: the node said more
// than keyroll reads, and the connection is closed.
var ErrReplyTooLarge = errors.New("the node's reply is over keyroll's bound of 8 MiB")

// minElement is what an element of an aggregate is counted for against the bound: at least 3 bytes
// on the wire ("+\r\n"), and 16 in go-redis's memory (an interface value in the slice it makes
// for the aggregate before reading the elements). keyroll's aggregates (ACL LIST) have elements
// of a hundred bytes and more.
const minElement = 16

// maxDepth bounds how deeply a reply's aggregates nest (go-redis reads them recursively).
const maxDepth = 32

// maxHeader bounds a length header's line ("$8388608\r\n" and the like).
const maxHeader = 24

// boundedConn reads a node's replies within limit bytes each: every command written starts a new
// reply (keyroll sends one command at a time on a connection).
type boundedConn struct {
	net.Conn
	limit int64
	scan  replyScan
	err   error // set once a reply broke the bound: the connection is done
}

func bound(c net.Conn, limit int64) *boundedConn {
	return &boundedConn{Conn: c, limit: limit, scan: replyScan{left: limit}}
}

func (c *boundedConn) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	c.scan = replyScan{left: c.limit}
	return c.Conn.Write(p)
}

func (c *boundedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if serr := c.scan.feed(p[:n]); serr != nil {
		c.err = serr
		_ = c.Close() // the node may still be sending: it is not read any further
		return 0, serr
	}
	return n, err
}

// replyScan follows a reply (RESP2 or RESP3) through its headers, as its bytes arrive, and keeps
// it within left bytes: the bytes read, and those that its declared lengths and counts still
// need at the least.
type replyScan struct {
	left int64 // bytes the reply may still take
	// reserved is what is declared and not read yet needs at the least: minElement for each
	// element to come, and the rest of a bulk payload; it never exceeds left.
	reserved int64
	// open holds each open aggregate's count of elements still to come.
	open []int64
	// bulk is how many bytes of a bulk payload, with its CRLF, are still to come.
	bulk int64
	// line is the current line: its type byte and, for a length header, its digits.
	line    []byte
	inLine  bool
	skipped bool // the line is a simple one, whose content is not kept
}

func (s *replyScan) feed(b []byte) error {
	for len(b) > 0 {
		if s.bulk > 0 {
			k := min(s.bulk, int64(len(b)))
			s.bulk, s.left, s.reserved = s.bulk-k, s.left-k, s.reserved-k
			b = b[k:]
			if s.bulk == 0 {
				s.element()
			}
			continue
		}
		i := 0
		for ; i < len(b) && b[i] != '\n'; i++ {
		}
		s.take(b[:i])
		s.left -= int64(min(i+1, len(b)))
		if s.left < s.reserved {
			return ErrReplyTooLarge
		}
		if i == len(b) {
			break
		}
		b = b[i+1:]
		if err := s.endLine(); err != nil {
			return err
		}
	}
	if len(s.line) > maxHeader {
		return fmt.Errorf("a length header of over %d bytes: %w", maxHeader, ErrReplyTooLarge)
	}
	return nil
}

// take adds part of the current line; only a length header's is kept.
func (s *replyScan) take(b []byte) {
	if len(b) == 0 {
		return
	}
	if !s.inLine {
		s.inLine, s.line = true, append(s.line[:0], b[0])
		switch b[0] {
		case '$', '=', '!', '*', '~', '>', '%', '|':
			s.skipped = false
		default:
			s.skipped = true
		}
		b = b[1:]
	}
	if !s.skipped && len(s.line) <= maxHeader {
		s.line = append(s.line, b[:min(len(b), maxHeader+1)]...)
	}
}

// endLine acts on a whole line: a length header opens a bulk payload or an aggregate, a simple
// line is an element.
func (s *replyScan) endLine() error {
	typ, skipped := byte(0), s.skipped
	if len(s.line) > 0 {
		typ = s.line[0]
	}
	digits := s.line
	if len(digits) > 0 {
		digits = digits[1:]
	}
	if n := len(digits); n > 0 && digits[n-1] == '\r' {
		digits = digits[:n-1]
	}
	s.inLine, s.line = false, s.line[:0]
	if skipped || typ == 0 {
		s.element()
		return nil
	}
	n, err := parseLength(digits)
	if err != nil {
		return err
	}
	return s.declare(typ, n)
}

// declare takes a length header: n bytes of a bulk payload, or n elements (pairs for a map).
func (s *replyScan) declare(typ byte, n int64) error {
	if n < 0 { // a null
		s.element()
		return nil
	}
	switch typ {
	case '$', '=', '!':
		if n+2 > s.left-s.reserved {
			return fmt.Errorf("a string of %d bytes: %w", n, ErrReplyTooLarge)
		}
		s.bulk = n + 2
		s.reserved += s.bulk
		return nil
	case '%':
		n *= 2
	case '|':
		n = n*2 + 1 // the attribute's pairs, then the reply they describe
	}
	if n == 0 {
		s.element()
		return nil
	}
	if n > (s.left-s.reserved)/minElement || len(s.open) == maxDepth {
		return fmt.Errorf("an aggregate of %d elements: %w", n, ErrReplyTooLarge)
	}
	s.open = append(s.open, n)
	s.reserved += n * minElement
	return nil
}

// element notes that one element, or the whole reply, has been read.
func (s *replyScan) element() {
	for len(s.open) > 0 {
		top := len(s.open) - 1
		s.open[top]--
		s.reserved -= minElement
		if s.open[top] > 0 {
			return
		}
		s.open = s.open[:top]
	}
}

// parseLength reads a header's decimal length, -1 for a null.
func parseLength(b []byte) (int64, error) {
	if len(b) == 0 || len(b) > 20 {
		return 0, fmt.Errorf("a malformed length header: %w", ErrReplyTooLarge)
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' || n > MaxReply {
			return 0, fmt.Errorf("a malformed or oversized length header: %w", ErrReplyTooLarge)
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		return -1, nil
	}
	return n, nil
}
