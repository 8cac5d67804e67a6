package apiversions

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/conversion"
	"github.com/keyroll/keyroll/test/framework"
)

// hugeReview is a ConversionReview of size bytes, made up as it is read: one object whose one
// annotation holds the rest.
type hugeReview struct {
	head, tail []byte
	fill, sent int64
}

func newHugeReview(size int64) *hugeReview {
	head := []byte(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"huge","desiredAPIVersion":"keyroll.dev/v1alpha1","objects":[{"apiVersion":"keyroll.dev/v1beta1","kind":"RedisCluster","metadata":{"name":"huge","annotations":{"filler":"`)
	tail := []byte(`"}}}]}}`)
	return &hugeReview{head: head, tail: tail, fill: size - int64(len(head)+len(tail))}
}

func (h *hugeReview) Read(p []byte) (int, error) {
	hl, tl := int64(len(h.head)), int64(len(h.tail))
	n := 0
	for n < len(p) {
		at, k := h.sent, 0
		switch {
		case at < hl:
			k = copy(p[n:], h.head[at:])
		case at < hl+h.fill:
			k = copy(p[n:min(len(p), n+int(hl+h.fill-at))], filler)
		case at < hl+h.fill+tl:
			k = copy(p[n:], h.tail[at-hl-h.fill:])
		default:
			if n == 0 {
				return 0, io.EOF
			}
			return n, nil
		}
		n += k
		h.sent += int64(k)
	}
	return n, nil
}

var filler = bytes.Repeat([]byte("a"), 64<<10)

// TestConversionWebhookTakesBoundedBodies: the manager's conversion webhook, where the real API
// server reaches it (the CRD's clientConfig, its CA), is sent six reviews of 64 MiB at once, half
// with a Content-Length and half chunked, as any pod that reaches its port may: each is refused
// (413, or the connection closed by the server), the process's heap grows by far less than one of them, and
// the API server's own conversions go on meanwhile and after (a v1alpha1 read of a RedisCluster
// stored as v1beta1).
func TestConversionWebhookTakesBoundedBodies(t *testing.T) {
	ctx, dyn, ns := onCurrentCRDs(t, "bounded")
	if err := fw.StartOperator(framework.OperatorOptions{Conversion: &conversion.Options{}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fw.StopOperator)
	rc := previousSample(t, "rediscluster-vaultlease.yaml", "orders", ns)
	rc.SetAPIVersion(v1beta1.GroupVersion.String())
	if _, err := dyn.Resource(betaClusters).Namespace(ns).Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	alphaRead := func() error {
		_, err := dyn.Resource(alphaClusters).Namespace(ns).Get(ctx, "orders", metav1.GetOptions{})
		return err
	}
	var url string
	var roots *x509.CertPool
	framework.Eventually(t, time.Minute, func() string {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := fw.Client.Get(ctx, client.ObjectKey{Name: "redisclusters.keyroll.dev"}, crd); err != nil {
			return err.Error()
		}
		c := crd.Spec.Conversion
		if c == nil || c.Webhook == nil || c.Webhook.ClientConfig == nil || c.Webhook.ClientConfig.URL == nil {
			return "the CRD names no webhook URL yet"
		}
		url, roots = *c.Webhook.ClientConfig.URL, x509.NewCertPool()
		if !roots.AppendCertsFromPEM(c.Webhook.ClientConfig.CABundle) {
			return "the CRD has no CA bundle yet"
		}
		if err := alphaRead(); err != nil {
			return "v1alpha1 read: " + err.Error()
		}
		return ""
	})
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}

	const size = 64 << 20
	var (
		baseline = heapInUse()
		peak     atomic.Uint64
		done     = make(chan struct{})
		sampled  sync.WaitGroup
	)
	sampled.Go(func() {
		for {
			if h := heapInUse(); h > peak.Load() {
				peak.Store(h)
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	var posts sync.WaitGroup
	outcomes := make([]string, 6)
	for i := range outcomes {
		posts.Go(func() {
			body := io.Reader(newHugeReview(size))
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
			if err != nil {
				outcomes[i] = err.Error()
				return
			}
			req.Header.Set("Content-Type", "application/json")
			if i%2 == 0 {
				req.ContentLength = size
			} else {
				req.ContentLength = -1 // chunked: the server learns the size only by reading
			}
			res, err := hc.Do(req)
			if ue := (*neturl.Error)(nil); errors.As(err, &ue) && ue.Timeout() {
				outcomes[i] = "no answer: " + err.Error() // not a refusal: the server is reading it all
				return
			}
			if err != nil {
				outcomes[i] = "refused: " + err.Error()
				return
			}
			defer res.Body.Close()
			msg, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
			outcomes[i] = fmt.Sprintf("status %d: %s", res.StatusCode, bytes.TrimSpace(msg))
		})
	}
	// The API server's conversions while the reviews are sent.
	var during []error
	for range 5 {
		during = append(during, alphaRead())
		time.Sleep(200 * time.Millisecond)
	}
	posts.Wait()
	close(done)
	sampled.Wait()

	for i, o := range outcomes {
		t.Logf("review %d (%s): %s", i, map[bool]string{true: "Content-Length", false: "chunked"}[i%2 == 0], o)
		if !strings.HasPrefix(o, "refused: ") && !strings.HasPrefix(o, fmt.Sprintf("status %d", http.StatusRequestEntityTooLarge)) {
			t.Errorf("a 64 MiB review was not refused: %s", o)
		}
	}
	grew := float64(peak.Load()) - float64(baseline)
	t.Logf("heap in use: %.1f MiB before, peak %.1f MiB above it while six 64 MiB reviews were sent", float64(baseline)/(1<<20), grew/(1<<20))
	if grew > 48<<20 {
		t.Errorf("the heap grew by %.1f MiB while the reviews were refused, want under 48 MiB (the bound is %d MiB for all reviews at once)", grew/(1<<20), conversion.MaxReviewBytes>>20)
	}
	for i, err := range during {
		if err != nil {
			t.Errorf("the API server's conversion %d during the flood failed: %v", i, err)
		}
	}
	if err := alphaRead(); err != nil {
		t.Errorf("the API server's conversion after the flood failed: %v", err)
	}
}

func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
