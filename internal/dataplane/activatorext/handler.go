package activatorext

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// Request is the ziptrail view of a request in the activator, shared by
// Handler and LocalityThrottler through the request context.
type Request struct {
	Refs         []string
	ProducerNode string

	arrived time.Time
	once    sync.Once
	stop    func()
	metrics *Metrics
	now     func() time.Time
}

// Dispatched ends the wait: the throttler handed the request a destination
// (or the request ended). It stops the keep-alive and records the wait;
// calls after the first do nothing.
func (r *Request) Dispatched(ctx context.Context) {
	if r == nil {
		return
	}
	r.once.Do(func() {
		if r.stop != nil {
			r.stop()
			r.metrics.waited(ctx, r.now().Sub(r.arrived))
		}
	})
}

type requestKey struct{}

// RequestFrom returns the request's ziptrail state, nil for a request
// without ziptrail headers.
func RequestFrom(ctx context.Context) *Request {
	r, _ := ctx.Value(requestKey{}).(*Request)
	return r
}

// Handler wraps the activator's handler: for a request with ziptrail
// headers it keeps the referenced objects alive until the throttler hands
// the request a destination, and passes the producer node on to
// LocalityThrottler. Requests without the headers pass through untouched.
type Handler struct {
	Next      http.Handler
	KeepAlive KeepAliver
	// Namespace returns the namespace of the request's revision (the
	// namespace its references were sealed for).
	Namespace func(*http.Request) string
	Metrics   *Metrics
	Now       func() time.Time
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	refs, node := ParseRefs(r.Header), ProducerNode(r.Header)
	if len(refs) == 0 && node == "" {
		h.Next.ServeHTTP(w, r)
		return
	}
	now := h.Now
	if now == nil {
		now = time.Now
	}
	zr := &Request{Refs: refs, ProducerNode: node, arrived: now(), metrics: h.Metrics, now: now}
	if len(refs) > 0 && h.KeepAlive != nil {
		ns := ""
		if h.Namespace != nil {
			ns = h.Namespace(r)
		}
		zr.stop = h.KeepAlive.KeepAlive(r.Context(), ns, refs)
		h.Metrics.keepAliveStarted(r.Context())
	}
	defer zr.Dispatched(r.Context())
	h.Next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestKey{}, zr)))
}
