package conversion

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const mib = 1 << 20

// TestConversionWebhookRefusesOversizedBodies: the handler Setup registers, served over a real
// listener, refuses a 64 MiB review with 413, at once when its Content-Length says so and after
// no more than the bound when it comes chunked, without the heap growing by much more than the
// bound; a small review still converts.
func TestConversionWebhookRefusesOversizedBodies(t *testing.T) {
	srv, served := serveCounting(t, Handler(conversionScheme(t)))

	t.Run("with a Content-Length", func(t *testing.T) {
		body, size := floodReview(64 * mib)
		before := served.Load()
		res := post(t, srv.URL+Path, body, size)
		read := served.Load() - before
		t.Logf("read %.2f MiB", mibs(read))
		expectTooLarge(t, res)
		if read > mib {
			t.Fatalf("the server read %.1f MiB of a body its Content-Length said was too large", mibs(read))
		}
	})

	t.Run("chunked", func(t *testing.T) {
		body, _ := floodReview(64 * mib)
		before := served.Load()
		var res *http.Response
		allocated, peak := heapWhile(func() { res = post(t, srv.URL+Path, body, -1) })
		read := served.Load() - before
		t.Logf("read %.1f MiB; %.1f MiB allocated, heap peaked %.1f MiB above its start", mibs(read), mibs(allocated), mibs(peak))
		expectTooLarge(t, res)
		if read > MaxReviewBytes+mib {
			t.Fatalf("the server read %.1f MiB of a chunked body, past the bound of %.0f MiB", mibs(read), mibs(MaxReviewBytes))
		}
		if allocated > MaxReviewBytes+8*mib {
			t.Fatalf("refusing a chunked 64 MiB review allocated %.1f MiB, want under %.0f MiB", mibs(allocated), mibs(MaxReviewBytes+8*mib))
		}
	})

	t.Run("a small review converts", func(t *testing.T) {
		review := smallReview(t)
		res := post(t, srv.URL+Path, bytes.NewReader(review), int64(len(review)))
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200", res.StatusCode)
		}
		expectConverted(t, res.Body)
	})
}

// TestBoundedReadsBodiesUpToTheLimit: a body of the limit reaches the handler whole, with or
// without a Content-Length, and in several pieces when it is longer than one; a byte more is
// refused before the handler runs.
func TestBoundedReadsBodiesUpToTheLimit(t *testing.T) {
	var got atomic.Pointer[[]byte]
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
		got.Store(&b)
	})
	for name, tc := range map[string]struct {
		limit, size int64
		known       bool
		want        int
	}{
		"empty":                          {limit: 100, size: 0, known: true, want: http.StatusOK},
		"at the limit, with its length":  {limit: 100, size: 100, known: true, want: http.StatusOK},
		"at the limit, chunked":          {limit: 100, size: 100, want: http.StatusOK},
		"a byte more, with its length":   {limit: 100, size: 101, known: true, want: http.StatusRequestEntityTooLarge},
		"a byte more, chunked":           {limit: 100, size: 101, want: http.StatusRequestEntityTooLarge},
		"several pieces, with length":    {limit: 3 * maxPiece, size: 3 * maxPiece, known: true, want: http.StatusOK},
		"several pieces, chunked":        {limit: 3 * maxPiece, size: 3 * maxPiece, want: http.StatusOK},
		"several pieces and a byte more": {limit: 3 * maxPiece, size: 3*maxPiece + 1, want: http.StatusRequestEntityTooLarge},
	} {
		t.Run(name, func(t *testing.T) {
			got.Store(nil)
			srv := httptest.NewServer(bounded(echo, tc.limit))
			defer srv.Close()
			sent := make([]byte, tc.size)
			for i := range sent {
				sent[i] = byte('a' + i%26)
			}
			size := int64(-1)
			if tc.known {
				size = tc.size
			}
			res := post(t, srv.URL, bytes.NewReader(sent), size)
			res.Body.Close()
			if res.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.want)
			}
			b := got.Load()
			if tc.want != http.StatusOK && b != nil {
				t.Fatal("the handler ran for a body past the limit")
			}
			if tc.want == http.StatusOK && (b == nil || !bytes.Equal(*b, sent)) {
				t.Fatal("the handler did not get the body whole")
			}
		})
	}
}

// TestReviewsShareTheBound: reviews whose sizes sum past the bound are not read and served at
// once: the second waits until the first is answered.
func TestReviewsShareTheBound(t *testing.T) {
	entered, release := make(chan string, 2), make(chan struct{})
	srv := httptest.NewServer(bounded(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- r.URL.Query().Get("review")
		<-release
	}), 100))
	defer srv.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	statuses := make(chan int, 2)
	send := func(review string) {
		res, err := http.Post(srv.URL+"?review="+review, "application/json", bytes.NewReader(make([]byte, 60)))
		if err != nil {
			statuses <- 0
			return
		}
		res.Body.Close()
		statuses <- res.StatusCode
	}
	go send("first")
	if got := <-entered; got != "first" {
		t.Fatalf("%s ran, want first", got)
	}
	go send("second")
	select {
	case got := <-entered:
		t.Fatalf("%s ran beside first, though their 120 bytes pass the bound of 100", got)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if got := <-entered; got != "second" {
		t.Fatalf("%s ran, want second", got)
	}
	for range 2 {
		if s := <-statuses; s != http.StatusOK {
			t.Fatalf("status %d, want 200", s)
		}
	}
}

// serveCounting serves h on a real listener and counts the bytes the server reads.
func serveCounting(t *testing.T, h http.Handler) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	read := &atomic.Int64{}
	srv.Listener = countingListener{Listener: srv.Listener, read: read}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, read
}

type countingListener struct {
	net.Listener
	read *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return countingConn{Conn: c, read: l.read}, err
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// post sends body to url, with a Content-Length of size, or chunked when size is -1.
func post(t *testing.T, url string, body io.Reader, size int64) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func expectTooLarge(t *testing.T, res *http.Response) {
	t.Helper()
	defer res.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(res.Body, 1024))
	if res.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(msg), "larger than") {
		t.Fatalf("status %d %q, want 413 and a short message", res.StatusCode, msg)
	}
}

// heapWhile runs f and returns the bytes allocated meanwhile (which bound the heap's growth)
// and how far the heap rose above where it started, sampled every millisecond.
func heapWhile(f func()) (allocated, peak int64) {
	var before, now runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	stop, sampled := make(chan struct{}), make(chan int64)
	go func() {
		var top int64
		for done := false; !done; {
			select {
			case <-stop:
				done = true
			case <-time.After(time.Millisecond):
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			top = max(top, int64(m.HeapAlloc)-int64(before.HeapAlloc))
		}
		sampled <- top
	}()
	f()
	close(stop)
	peak = <-sampled
	runtime.ReadMemStats(&now)
	return int64(now.TotalAlloc - before.TotalAlloc), peak
}

func mibs(n int64) float64 { return float64(n) / mib }
