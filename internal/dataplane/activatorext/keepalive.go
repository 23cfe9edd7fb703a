package activatorext

import (
	"context"
	"errors"
	"sync"
	"time"
)

// KeepAliver keeps referenced objects alive at their producers.
type KeepAliver interface {
	// KeepAlive starts extending the TTL of refs (references of namespace)
	// and returns a function that stops it; stop waits for the keep-alive to
	// end and may be called more than once.
	KeepAlive(ctx context.Context, namespace string, refs []string) (stop func())
}

// ExtendFunc asks the producer of ref to keep the object until `until`.
// It returns an error wrapping ErrGone when the object no longer exists or
// the reference can never be extended (expired, tampered, foreign), and any
// other error for a failure worth retrying.
type ExtendFunc func(ctx context.Context, namespace, ref string, until time.Time) error

// ErrGone reports that extending a reference is pointless from now on.
var ErrGone = errors.New("referenced object is gone")

// Periodic is a KeepAliver that calls Extend for every reference at once and
// then every Interval, each time pushing the expiry to now+Extension, until
// stopped. References whose extension fails for good are dropped.
type Periodic struct {
	Extend    ExtendFunc
	Interval  time.Duration // default 5s
	Extension time.Duration // default 30s; should exceed Interval
	Metrics   *Metrics      // optional

	// Now and Tick replace the clock and the ticker (tests drive rounds by
	// hand instead of waiting).
	Now  func() time.Time
	Tick func(d time.Duration) (<-chan time.Time, func())
}

func (p *Periodic) interval() time.Duration {
	if p.Interval > 0 {
		return p.Interval
	}
	return 5 * time.Second
}

func (p *Periodic) extension() time.Duration {
	if p.Extension > 0 {
		return p.Extension
	}
	return 30 * time.Second
}

func (p *Periodic) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

func (p *Periodic) tick(d time.Duration) (<-chan time.Time, func()) {
	if p.Tick != nil {
		return p.Tick(d)
	}
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// KeepAlive implements KeepAliver. The first round runs in the background
// at once, so the request is never delayed by its producers.
func (p *Periodic) KeepAlive(ctx context.Context, namespace string, refs []string) func() {
	if len(refs) == 0 {
		return func() {}
	}
	// The keep-alive ends with the request (ctx) at the latest.
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	live := append([]string(nil), refs...)
	ticks, stopTicker := p.tick(p.interval())
	go func() {
		// done closes last: whoever waits for it (stop) finds a panic
		// already counted.
		defer close(done)
		// References are user input: whatever they make the extender do
		// must not end the activator, which serves the whole cluster.
		defer recovered(ctx, p.Metrics, "keepalive")
		defer stopTicker()
		for {
			live = p.round(ctx, namespace, live)
			if len(live) == 0 {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-ticks:
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}

// round extends every live reference once and returns those still worth
// extending.
func (p *Periodic) round(ctx context.Context, namespace string, refs []string) []string {
	rctx, cancel := context.WithTimeout(ctx, p.interval())
	defer cancel()
	until := p.now().Add(p.extension())
	kept := refs[:0]
	for _, r := range refs {
		if ctx.Err() != nil {
			return nil
		}
		err := p.Extend(rctx, namespace, r, until)
		switch {
		case err == nil:
			p.Metrics.extend(ctx, ResultExtended)
			kept = append(kept, r)
		case errors.Is(err, ErrGone):
			p.Metrics.extend(ctx, ResultGone)
		case ctx.Err() != nil:
			// Stopped mid-call: not a producer failure.
			return nil
		default:
			p.Metrics.extend(ctx, ResultError)
			kept = append(kept, r)
		}
	}
	return kept
}
