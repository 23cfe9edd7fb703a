package messaging

import (
	"context"
	"sync"
	"time"
)

// deadlines ends the waiting sends and receives of the function's socket
// at their timeouts with one timer for all of them. A timer per operation
// costs a wake-up of the thread waiting in the network poller each time
// one is set (the poller's sleep must be shortened to it); this one is
// set again only when a deadline comes before the one it is set for, or
// when it fires, and a finished operation leaves it as it is (it fires
// for nothing at most once, then rests).
type deadlines struct {
	mu    sync.Mutex
	ops   map[*deadline]struct{}
	timer *time.Timer
	at    time.Time // when the timer fires (zero: not set)
}

// deadline is one operation's: fn runs at at, unless cancelled first.
type deadline struct {
	d  *deadlines
	at time.Time
	fn func()
}

// add runs fn at at (from the timer's goroutine) unless the returned
// deadline is cancelled first.
func (d *deadlines) add(at time.Time, fn func()) *deadline {
	x := &deadline{d: d, at: at, fn: fn}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ops == nil {
		d.ops = map[*deadline]struct{}{}
	}
	d.ops[x] = struct{}{}
	if d.at.IsZero() || at.Before(d.at) {
		d.set(at)
	}
	return x
}

// set arms the timer for at (under mu).
func (d *deadlines) set(at time.Time) {
	d.at = at
	if d.timer == nil {
		d.timer = time.AfterFunc(time.Until(at), d.fire)
		return
	}
	d.timer.Reset(time.Until(at))
}

// cancel drops the deadline: false when its fn ran or runs.
func (x *deadline) cancel() bool {
	if x == nil {
		return false
	}
	x.d.mu.Lock()
	defer x.d.mu.Unlock()
	_, ok := x.d.ops[x]
	delete(x.d.ops, x)
	return ok
}

func (d *deadlines) fire() {
	now := time.Now()
	var due []*deadline
	var next time.Time
	d.mu.Lock()
	for x := range d.ops {
		switch {
		case !x.at.After(now):
			due = append(due, x)
			delete(d.ops, x)
		case next.IsZero() || x.at.Before(next):
			next = x.at
		}
	}
	d.at = time.Time{}
	if !next.IsZero() {
		d.set(next)
	}
	d.mu.Unlock()
	for _, x := range due {
		x.fn()
	}
}

// opContext is a context of its own for an operation that outlives its
// caller's call: it ends after timeout (0: never) with
// context.DeadlineExceeded as its cause, or with stop.
func (r *Router) opContext(timeout time.Duration) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	if timeout <= 0 {
		return ctx, func() { cancel(context.Canceled) }
	}
	x := r.deadlines.add(time.Now().Add(timeout), func() { cancel(context.DeadlineExceeded) })
	return ctx, func() {
		x.cancel()
		cancel(context.Canceled)
	}
}
