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

// maxPause bounds how long one call's connection is left unread
// (Limits.RefusalsPerSecond).
const maxPause = time.Second

// pacer holds a connection's refusals to Limits.RefusalsPerSecond.
type pacer struct {
	lim *rate.Limiter

	mu    sync.Mutex
	until time.Time // the connection is not read before
}

// connOf is the connection of the call of ctx, nil when the guard cannot
// tell it (an address shared by several, as a Unix socket's).
func (g *Guard) connOf(ctx context.Context) *conn {
	if g.l.RefusalsPerSecond <= 0 {
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

// refused counts a refused call of c: beyond the rate, the connection's
// next call waits before it is read.
func (c *conn) refused() {
	if c == nil || c.pacer == nil {
		return
	}
	now := time.Now()
	r := c.pacer.lim.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if d > maxPause {
		r.CancelAt(now) // no debt beyond a pause: the next refusal finds the same
		d = maxPause
	}
	if d <= 0 {
		return
	}
	c.pacer.mu.Lock()
	c.pacer.until = now.Add(d)
	c.pacer.mu.Unlock()
}

// pace waits, on the connection's reader (the tap's goroutine, so nothing
// more of the connection is read meanwhile), until c's refusals are back
// within the rate, or ctx ends.
func (c *conn) pace(ctx context.Context) {
	if c == nil || c.pacer == nil {
		return
	}
	c.pacer.mu.Lock()
	d := time.Until(c.pacer.until)
	c.pacer.mu.Unlock()
	if d <= 0 {
		return
	}
	c.g.count("refusals_paced")
	c.g.paced.Add(1)
	t := time.NewTimer(min(d, maxPause))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
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
