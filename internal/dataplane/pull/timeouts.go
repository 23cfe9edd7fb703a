package pull

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Timeouts bound the stages of a consumer's pull, so that a producer that
// stopped answering — its node lost, its address blackholed (packets
// dropped, no reset), its process hung — ends the pull with
// ErrProducerGone, and so in the fallback to the storage tiers, instead
// of holding it until the caller's context ends. Zero fields take the
// defaults.
type Timeouts struct {
	// Dial bounds the TCP connect (DefaultDialTimeout).
	Dial time.Duration
	// Response bounds the wait for an answer's header, from the request
	// sent (DefaultResponseTimeout). It covers the producer's own work
	// before it answers: reading a spilled object back from Redis.
	Response time.Duration
	// Stall bounds a pause in the body (DefaultStallTimeout): every read
	// that brings bytes moves the deadline, so a transfer that keeps
	// making progress is never cut, however long it takes in all.
	Stall time.Duration
}

const (
	// DefaultDialTimeout lets Linux retransmit a lost SYN three times
	// (at 1, 3 and 7 s).
	DefaultDialTimeout = 10 * time.Second
	// DefaultResponseTimeout: a live producer answers within
	// milliseconds, or the time of a Redis read of a spilled object.
	DefaultResponseTimeout = 30 * time.Second
	// DefaultStallTimeout matches the producer's own bound on a
	// consumer that stops reading (Server.WriteTimeout's default).
	DefaultStallTimeout = 30 * time.Second
	// MaxTimeout bounds every pull timeout: more is a mistake (an
	// invocation waiting an hour for an unreachable pod).
	MaxTimeout = time.Hour
)

// Validate reports a timeout that is negative or above MaxTimeout.
func (t Timeouts) Validate() error {
	var errs []error
	for _, v := range []struct {
		name string
		d    time.Duration
	}{{"dial", t.Dial}, {"response", t.Response}, {"stall", t.Stall}} {
		if v.d < 0 || v.d > MaxTimeout {
			errs = append(errs, fmt.Errorf("pull %s timeout %v: want a positive duration of at most %v (zero: the default)", v.name, v.d, MaxTimeout))
		}
	}
	return errors.Join(errs...)
}

func (t Timeouts) dial() time.Duration     { return orDefault(t.Dial, DefaultDialTimeout) }
func (t Timeouts) response() time.Duration { return orDefault(t.Response, DefaultResponseTimeout) }
func (t Timeouts) stall() time.Duration    { return orDefault(t.Stall, DefaultStallTimeout) }

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Why a pull went to the tiers instead (the label of
// ziptrail_dataplane_pull_fallbacks_total).
const (
	reasonDialTimeout     = "dial_timeout"     // no connection within Timeouts.Dial
	reasonDialError       = "dial_error"       // refused, no route
	reasonResponseTimeout = "response_timeout" // no answer's header within Timeouts.Response
	reasonBodyStall       = "body_stall"       // no byte of the body within Timeouts.Stall
	reasonConnectionLost  = "connection_lost"  // closed, reset or garbled before the answer's end
	reasonClientClosed    = "client_closed"
)

// goneError is an ErrProducerGone with the reason.
type goneError struct {
	reason, addr string
	err          error
}

func (e *goneError) Error() string {
	return fmt.Sprintf("%v: %s: %v", ErrProducerGone, e.addr, e.err)
}

func (e *goneError) Unwrap() error { return ErrProducerGone }

// goneReason is the reason of an ErrProducerGone.
func goneReason(err error) string {
	var ge *goneError
	if errors.As(err, &ge) {
		return ge.reason
	}
	return "other"
}

// timedOut tells a deadline's (or a dial timeout's) error.
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// deadlineConn is a pull connection and its deadlines: one for the
// request and the answer's header together, then, for the body, a read
// deadline pushed ahead before every read, so only a pause cuts it. The
// caller's context ending (interrupt) sets a deadline in the past that
// no later read moves.
type deadlineConn struct {
	net.Conn

	mu          sync.Mutex
	stall       time.Duration // > 0: reading a body
	interrupted bool
}

func (d *deadlineConn) Read(p []byte) (int, error) {
	d.mu.Lock()
	if d.stall > 0 && !d.interrupted {
		_ = d.Conn.SetReadDeadline(time.Now().Add(d.stall))
	}
	d.mu.Unlock()
	return d.Conn.Read(p)
}

// expectAnswer starts an exchange: the request and the answer's header
// have timeout.
func (d *deadlineConn) expectAnswer(timeout time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stall, d.interrupted = 0, false
	_ = d.Conn.SetDeadline(time.Now().Add(timeout))
}

// expectBody switches to the body's deadlines: stall from each read on.
func (d *deadlineConn) expectBody(stall time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stall = stall
}

// interrupt ends the exchange under way (the caller's context ended).
func (d *deadlineConn) interrupt() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.interrupted = true
	_ = d.Conn.SetDeadline(time.Unix(1, 0))
}

// idle clears the deadlines of a connection going back to the pool.
func (d *deadlineConn) idle() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stall = 0
	_ = d.Conn.SetDeadline(time.Time{})
}
