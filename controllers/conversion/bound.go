package conversion

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"golang.org/x/sync/semaphore"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	convwebhook "sigs.k8s.io/controller-runtime/pkg/webhook/conversion"
)

// MaxReviewBytes bounds each ConversionReview a replica reads, and all those it reads or converts
// at once. The webhook port is open to every pod (a NetworkPolicy cannot name the API server) and
// asks for no client certificate, and controller-runtime's handler decodes whatever it is sent:
// one 64 MiB review cost ~900 MiB of heap (issue 47).
//
// What the API server sends: for a get, a write or a watch event, one object per review, and an
// object is at most what etcd takes in one request (1.5 MiB by default, its --max-request-bytes).
// For a list, one review carries every object of the page that is not in the asked version
// (apiextensions-apiserver's webhookConverter converts an UnstructuredList at once): 4 MiB holds
// a page of 500 (kubectl's and client-go's page size) RedisClusters of 8 KiB each (random ones,
// filled as the round-trip test fills them, average 5 KiB). Only clients of v1alpha1 make the API
// server convert; keyroll itself reads v1beta1. A larger review is refused with 413, and the API
// server fails that request.
//
// What it costs: the heap rises by about 10 times a review's size for real objects (a list of
// 820 random RedisClusters, 4 MiB: +38 MiB) and 32 times for the worst (one object with 300,000
// empty annotations, 4 MiB: +128 MiB), which the manager's 256 MiB limit holds beside its own use,
// once. So the bound is also a budget: reviews whose sizes sum past it wait for those before them.
const MaxReviewBytes = 4 << 20

// reviewTimeout bounds how long one review may wait, arrive and be answered: the API server gives
// up on a conversion webhook call after 30 s (k8s.io/apiserver/pkg/util/webhook).
// controller-runtime builds the webhook server's http.Server itself (webhook.Options has no field
// for it; v0.25 sets ReadHeaderTimeout 32 s, IdleTimeout 90 s, MaxHeaderBytes 1 MiB, and no
// ReadTimeout or WriteTimeout), so the handler sets the body's read and the answer's write
// deadlines itself, through http.ResponseController.
const reviewTimeout = 30 * time.Second

// Handler is the conversion webhook as Setup registers it at Path: controller-runtime's handler
// behind the bound on the reviews' size (MaxReviewBytes) and time (reviewTimeout). Its registry of
// converters is empty: the API types convert themselves (v1alpha1's ConvertTo and ConvertFrom,
// v1beta1 the hub), which the handler falls back to for a kind with no converter registered.
func Handler(scheme *runtime.Scheme) http.Handler {
	return bounded(convwebhook.NewWebhookHandler(scheme, convwebhook.NewRegistry()), MaxReviewBytes)
}

// bounded serves with h the requests whose body is at most limit bytes, read in full before h
// sees it, while the bodies being read or served sum to at most limit (one of unknown length
// counts as limit). A larger body is refused with 413 and the rest of it never read: at once
// when its Content-Length says so, else once limit+1 bytes have come.
func bounded(h http.Handler, limit int64) http.Handler {
	budget := semaphore.NewWeighted(limit)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			tooLarge(w, r, limit)
			return
		}
		deadline := time.Now().Add(reviewTimeout)
		// Errors mean a ResponseWriter without deadlines (not net/http's server): nothing to set.
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(deadline)
		_ = rc.SetWriteDeadline(deadline)
		share := limit
		if r.ContentLength >= 0 {
			share = r.ContentLength
		}
		ctx, cancel := context.WithDeadline(r.Context(), deadline)
		defer cancel()
		if err := budget.Acquire(ctx, share); err != nil {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many conversion reviews at once", http.StatusTooManyRequests)
			return
		}
		defer budget.Release(share)
		serveBody(h, w, r, limit)
	})
}

// serveBody reads the body, of at most limit bytes, and serves it with h.
func serveBody(h http.Handler, w http.ResponseWriter, r *http.Request, limit int64) {
	body, err := readBody(w, r, limit)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		tooLarge(w, r, limit)
		return
	}
	if err != nil {
		http.Error(w, "reading the conversion review: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(body)
	h.ServeHTTP(w, r)
}

// maxPiece is the largest piece readBody reads a body in.
const maxPiece = 1 << 20

// readBody reads the request's body, of at most limit bytes (an *http.MaxBytesError past it,
// and the connection is closed after the answer), in pieces of at most maxPiece kept side by
// side rather than copied into a doubling buffer: a body past the limit costs the limit and a
// piece, not twice the limit. The first piece is as long as the Content-Length says (a small
// review is one piece), or 512 bytes when it is unknown, and each next one twice as long.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) (io.Reader, error) {
	body := http.MaxBytesReader(w, r.Body, limit)
	size := int64(bytes.MinRead)
	if r.ContentLength >= 0 {
		size = r.ContentLength + 1 // one byte more, to meet the end in the same read
	}
	var pieces []io.Reader
	for {
		p := make([]byte, min(size, maxPiece))
		n, err := io.ReadFull(body, p)
		pieces = append(pieces, bytes.NewReader(p[:n]))
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return io.MultiReader(pieces...), nil
		}
		if err != nil {
			return nil, err
		}
		size *= 2
	}
}

// tooLarge answers 413 and closes the connection, so that the rest of the body is not read.
func tooLarge(w http.ResponseWriter, r *http.Request, limit int64) {
	ctrl.Log.WithName("conversion-webhook").V(1).Info("Refused an oversized conversion review",
		"from", r.RemoteAddr, "contentLength", r.ContentLength, "limit", limit)
	w.Header().Set("Connection", "close")
	http.Error(w, fmt.Sprintf("conversion review larger than %d bytes", limit), http.StatusRequestEntityTooLarge)
}
