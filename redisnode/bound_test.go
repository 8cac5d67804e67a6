package redisnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestReplyScanFollowsWholeReplies(t *testing.T) {
	replies := map[string]string{
		"simple":        "+OK\r\n",
		"error":         "-ERR no such user\r\n",
		"integer":       ":42\r\n",
		"bulk":          "$5\r\nhello\r\n",
		"empty bulk":    "$0\r\n\r\n",
		"null bulk":     "$-1\r\n",
		"bulk with LF":  "$4\r\na\nb\n\r\n",
		"array":         "*3\r\n$3\r\nfoo\r\n:1\r\n+bar\r\n",
		"nested":        "*2\r\n*2\r\n:1\r\n:2\r\n*0\r\n",
		"null array":    "*-1\r\n",
		"resp3 map":     "%2\r\n+a\r\n:1\r\n+b\r\n_\r\n",
		"client list":   "$" + fmt.Sprint(len(clientLine(1000))) + "\r\n" + clientLine(1000) + "\r\n",
		"long simple":   "+" + strings.Repeat("x", 1<<20) + "\r\n",
		"empty array":   "*0\r\n",
		"verbatim":      "=8\r\ntxt:abcd\r\n",
		"nested arrays": "*1\r\n*1\r\n*1\r\n$1\r\nx\r\n",
	}
	for name, reply := range replies {
		t.Run(name, func(t *testing.T) {
			for _, chunk := range []int{1, 7, len(reply)} {
				s := replyScan{left: MaxReply}
				for b := []byte(reply); len(b) > 0; {
					k := min(chunk, len(b))
					if err := s.feed(b[:k]); err != nil {
						t.Fatalf("chunks of %d: %v", chunk, err)
					}
					b = b[k:]
				}
				if len(s.open) != 0 || s.bulk != 0 || s.inLine || s.reserved != 0 {
					t.Fatalf("chunks of %d: the reply is not seen whole: %+v", chunk, s)
				}
			}
		})
	}
}

func clientLine(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "id=%d addr=10.0.0.1:%d laddr=10.0.0.2:6379 fd=8 name= age=0 idle=0 flags=N db=0 user=app resp=2\n", i, 1024+i)
	}
	return b.String()
}

// hostile replies, each over MaxReply in bytes or in what it declares.
func hostile() map[string][]byte {
	return map[string][]byte{
		"declared bulk":   []byte("$999999999999\r\nabc"),
		"huge length":     []byte("$99999999999999999999999999\r\n"),
		"declared array":  []byte("*100000000\r\n:1\r\n"),
		"nested declared": []byte(strings.Repeat("*200000\r\n", 5)),
		"deep nesting":    []byte(strings.Repeat("*1\r\n", 10000)),
		"real bulk":       []byte(fmt.Sprintf("$%d\r\n%s\r\n", MaxReply+1, strings.Repeat("n", MaxReply+1))),
		"endless line":    []byte("+" + strings.Repeat("y", MaxReply+1)),
		"many elements":   []byte(fmt.Sprintf("*%d\r\n%s", MaxReply/4, strings.Repeat(":1\r\n", MaxReply/4))),
	}
}

// TestHostileRepliesAreRefusedUnread serves each hostile reply to every command after the
// handshake and checks that the client refuses it with ErrReplyTooLarge, within its bound in
// time and without growing the heap by what the reply declares.
func TestHostileRepliesAreRefusedUnread(t *testing.T) {
	for name, reply := range hostile() {
		t.Run(name, func(t *testing.T) {
			addr := serveHostile(t, reply)
			n := New(addr, "keyroll-admin", "pw", nil)
			defer func() { _ = n.Close() }()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := n.Clients(ctx)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrReplyTooLarge) {
				t.Fatalf("CLIENT LIST answered with %s: %v, want ErrReplyTooLarge", name, err)
			}
			if d := time.Since(start); d > Timeout {
				t.Errorf("refused after %s, over Timeout", d)
			}
			// TotalAlloc counts every allocation, freed or not: what reading the reply cost.
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 4*MaxReply {
				t.Errorf("reading the refused reply allocated %d MiB", grew>>20)
			}
		})
	}
}

// serveHostile answers AUTH and the like with +OK, HELLO with an error, and CLIENT LIST with reply, on loopback.
func serveHostile(t *testing.T, reply []byte) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go answer(c, reply)
		}
	}()
	return l.Addr().String()
}

func answer(c net.Conn, reply []byte) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r, w := bufio.NewReader(c), bufio.NewWriter(c)
	for {
		cmd, err := readCommand(r)
		if err != nil {
			return
		}
		switch {
		case strings.EqualFold(cmd, "client"):
			_, _ = w.Write(reply)
		case strings.EqualFold(cmd, "hello"):
			_, _ = w.WriteString("-ERR unknown command 'HELLO'\r\n") // as Redis 5 would: AUTH follows
		default:
			_, _ = w.WriteString("+OK\r\n")
		}
		if w.Flush() != nil {
			return
		}
	}
}

// readCommand reads one RESP array of bulk strings and returns its first word.
func readCommand(r *bufio.Reader) (string, error) {
	var n int
	if _, err := fmt.Fscanf(r, "*%d\r\n", &n); err != nil {
		return "", err
	}
	var first string
	for i := range n {
		var l int
		if _, err := fmt.Fscanf(r, "$%d\r\n", &l); err != nil {
			return "", err
		}
		b := make([]byte, l+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", err
		}
		if i == 0 {
			first = string(b[:l])
		}
	}
	return first, nil
}
