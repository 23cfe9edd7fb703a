// Package retry paces the gateway clients' retries (the CLI, the Go admin
// client): exponential back-off with jitter, a server's Retry-After
// honoured up to a cap, all within an overall budget, so that a rollout of
// the operator (its gateway without a ready endpoint for 10–30 s) passes
// unnoticed while a gateway that stays down is reported in bounded time.
package retry

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// Defaults of a Backoff's zero fields.
const (
	// DefaultFor is the overall budget of a call's retries: longer than an
	// operator's rollout takes.
	DefaultFor = 2 * time.Minute
	// DefaultInitial is the first pause; each next one doubles, to
	// DefaultMax.
	DefaultInitial = 200 * time.Millisecond
	DefaultMax     = 5 * time.Second
	// MaxRetryAfter caps the pause a server's Retry-After asks for.
	MaxRetryAfter = 30 * time.Second
)

// Backoff paces the retries of one call. The zero Backoff uses the
// defaults; For < 0 allows no retry.
type Backoff struct {
	For          time.Duration // budget from the first failure
	Initial, Max time.Duration
	Now          func() time.Time // default time.Now

	start time.Time
	next  time.Duration
}

// Next is the pause before the next try after a failure: the doubling
// back-off with jitter (half of it fixed, half random), or retryAfter (as
// the server asked, at most MaxRetryAfter) when longer, never past the
// budget. ok is false once the budget is spent.
func (b *Backoff) Next(retryAfter time.Duration) (pause time.Duration, ok bool) {
	if b.For < 0 {
		return 0, false
	}
	now := time.Now
	if b.Now != nil {
		now = b.Now
	}
	budget := b.For
	if budget == 0 {
		budget = DefaultFor
	}
	if b.start.IsZero() {
		b.start = now()
		b.next = b.Initial
		if b.next <= 0 {
			b.next = DefaultInitial
		}
	}
	left := budget - now().Sub(b.start)
	if left <= 0 {
		return 0, false
	}
	maxPause := b.Max
	if maxPause <= 0 {
		maxPause = DefaultMax
	}
	pause = b.next/2 + rand.N(b.next/2+1)
	b.next = min(2*b.next, maxPause)
	pause = max(pause, min(retryAfter, MaxRetryAfter))
	return min(pause, left), true
}

// Sleep pauses for d, or until ctx ends (its error).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RetryAfter reads an HTTP Retry-After header (seconds or an HTTP date);
// 0 when absent or unreadable.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// GRPCReconnect is how a gRPC connection to the operator (the sidecars'
// control stream, the admin client's gateway, one replica's proxy to
// another) is dialled again: within 2 s at most. gRPC's own back-off grows
// to 2 minutes, and after an operator away for half a minute its clients
// came back up to a minute after it did.
var GRPCReconnect = grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2,
	MaxDelay: 2 * time.Second}, MinConnectTimeout: 5 * time.Second}
