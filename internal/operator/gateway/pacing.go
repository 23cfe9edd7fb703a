package gateway

import (
	"context"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
)

// DefaultRefusalsPerSecond is Handler.RefusalsPerSecond's default: the
// refused requests (401, 403, 413, 429) one connection may have a second,
// in bursts of as many, before its next request waits (ConnContext).
const DefaultRefusalsPerSecond = 10

var refusalsPaced = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "ziptrail_gateway_refusals_paced_total",
	Help: "Requests to the session gateway's HTTP API that waited (at most 1 s) because their connection had more refused " +
		"requests (401, 403, 413, 429) a second than the gateway's refusal rate (docs/hostile-input.md).",
})

func init() { metrics.Registry.MustRegister(refusalsPaced) }

type pacerKey struct{}

// ConnContext gives each connection of the gateway's HTTP server its
// refusal pacer: set it as the http.Server's ConnContext. Each request
// refused (401, 403, 413, 429) counts against its connection; past
// RefusalsPerSecond the connection's next request waits before it is
// served (at most guard.MaxPause), so a client refused in a loop is served
// at that rate, not as fast as it sends (the gRPC gateway's connections
// are paced alike, guard.Limits.RefusalsPerSecond). A client never
// refused never waits.
func (h *Handler) ConnContext(ctx context.Context, _ net.Conn) context.Context {
	r := h.RefusalsPerSecond
	if r == 0 {
		r = DefaultRefusalsPerSecond
	}
	if r < 0 {
		return ctx
	}
	return context.WithValue(ctx, pacerKey{}, guard.NewPacer(r))
}

// paced waits for r's connection's refusals to be within their rate, and
// returns w counting r's answer against them (w itself when the server
// paces nothing). A request another replica forwarded (sharded engine)
// is not paced: the forwarding replica paced its client's connection, and
// its connections to this one carry every client's requests.
func (h *Handler) paced(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	p, _ := r.Context().Value(pacerKey{}).(*guard.Pacer)
	if p == nil || h.fromPeer(r) {
		return w
	}
	if p.Wait(r.Context()) {
		refusalsPaced.Inc()
	}
	return &refusalCounter{ResponseWriter: w, p: p}
}

// refusalCounter counts a refused answer against its connection's pacer.
type refusalCounter struct {
	http.ResponseWriter
	p *guard.Pacer
}

func (w *refusalCounter) WriteHeader(code int) {
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		w.p.Refused()
	}
	w.ResponseWriter.WriteHeader(code)
}

// Flush flushes the answer (the events stream, a streamed result).
func (w *refusalCounter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap is the writer underneath (http.ResponseController).
func (w *refusalCounter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// fromPeer: r was forwarded (ProxiedHeader, which anyone can set) from
// the address of another replica.
func (h *Handler) fromPeer(r *http.Request) bool {
	return h.Owners != nil && r.Header.Get(ProxiedHeader) != "" && isPeer(r.Context(), h.Owners, r.RemoteAddr)
}

// isPeer: the host of addr (host:port) is another replica's (Owners.Peers).
func isPeer(ctx context.Context, owners Owners, addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	peers, err := owners.Peers(ctx)
	if err != nil {
		return false
	}
	for _, p := range peers {
		if ph, _, err := net.SplitHostPort(p); err == nil && ph == host {
			return true
		}
	}
	return false
}
