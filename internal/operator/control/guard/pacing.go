package guard

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// MaxPause bounds how long one call waits for its connection's refusals
// to be back within their rate (Pacer).
const MaxPause = time.Second

// Pacer holds one connection's refused calls to a rate: each refusal is
// counted (Refused), and past the rate the connection's next call waits
// (Wait) before it is read or answered, for as long as the rate needs and
// at most MaxPause. A client refused in a loop is then served at the
// rate, not as fast as it sends; one refused now and then never waits.
// The gRPC guard paces each connection (Limits.RefusalsPerSecond), the
// session gateway's HTTP server each of its connections.
type Pacer struct {
	lim *rate.Limiter

	mu    sync.Mutex
	until time.Time // the connection's next call waits until then
}

// NewPacer paces at perSecond refusals a second, in bursts of as many
// (at least 1).
func NewPacer(perSecond float64) *Pacer {
	return &Pacer{lim: rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond)))}
}

// Refused counts a refused call: beyond the rate, the next call waits.
func (p *Pacer) Refused() {
	if p == nil {
		return
	}
	now := time.Now()
	r := p.lim.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if d > MaxPause {
		r.CancelAt(now) // no debt beyond a pause: the next refusal finds the same
		d = MaxPause
	}
	if d <= 0 {
		return
	}
	p.mu.Lock()
	p.until = now.Add(d)
	p.mu.Unlock()
}

// Wait waits until the connection's refusals are back within the rate,
// or ctx ends; it says whether it waited.
func (p *Pacer) Wait(ctx context.Context) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	d := time.Until(p.until)
	p.mu.Unlock()
	if d <= 0 {
		return false
	}
	t := time.NewTimer(min(d, MaxPause))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return true
}

// connOf is the connection of the call of ctx, nil when the guard cannot
// tell it (an address shared by several, as a Unix socket's).
func (g *Guard) connOf(ctx context.Context) *conn {
	if g.l.RefusalsPerSecond <= 0 || (g.Exempt != nil && g.Exempt(ctx)) {
		return nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	key := connKey(p.Addr, p.LocalAddr)
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.conns[key]
}

// refused counts a refused call of c.
func (c *conn) refused() {
	if c != nil {
		c.pacer.Refused()
	}
}

// pace waits, on the connection's reader (the tap's goroutine, so nothing
// more of the connection is read meanwhile), until c's refusals are back
// within the rate, or ctx ends.
func (c *conn) pace(ctx context.Context) {
	if c != nil && c.pacer.Wait(ctx) {
		c.g.count("refusals_paced")
		c.g.paced.Add(1)
	}
}

// Paced is how many calls waited for their connection's refusals to be
// back within Limits.RefusalsPerSecond (the metric's refusals_paced).
func (g *Guard) Paced() int64 { return g.paced.Load() }

// refusals is a stats handler counting the calls refused after the tap
// (a message over MaxRecvMsgSize, a handler's Unauthenticated,
// PermissionDenied or ResourceExhausted) against their connection.
type refusals struct{ g *Guard }

func (refusals) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (r refusals) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if end, ok := s.(*stats.End); ok && isRefusal(end.Error) {
		r.g.connOf(ctx).refused()
	}
}

// isRefusal: err refuses the caller for what it sent (not the server's
// trouble, as Unavailable is).
func isRefusal(err error) bool {
	if err == nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied, codes.ResourceExhausted:
		return true
	}
	return false
}

func (refusals) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (refusals) HandleConn(context.Context, stats.ConnStats) {}
