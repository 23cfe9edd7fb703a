package sidecar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A function whose process dies before it answers (killed, out of memory,
// crashed) is run again, with the same envelope and idempotency key, once
// its container is back: ziptrail delivers invocations at least once, and
// the function's code has the key for its side effects. The sidecar tells
// this case by what the proxy to the function saw, through an
// httptrace.ClientTrace on each attempt's request: it asked for a
// connection to the function (GetConn: the address to wait for) and got
// no byte of a response (GotFirstResponseByte never came), and the answer
// the proxy then makes up itself (queue-proxy's error handler: 502 with
// the transport error) is held back. Not retried:
//
//   - a function that answered, whatever its status (a 500 of its own is
//     its outcome), and an answer that broke off after its header (the
//     function ran and said something: reported failed, as before);
//   - an invocation whose own context ended (the revision's timeout): the
//     proxy's answer passes as it is;
//   - a handler chain that never dialled the function.
//
// Before each retry the sidecar waits for the function to accept
// connections again (a dial every 50 ms, backing off to 1 s), at most
// FunctionRestartWait and within the invocation's timeout. After
// FunctionCrashRetries retries the caller gets 502 and the end is
// reported failed, saying how many times the process died; the
// idempotency record holds only that final answer.

// Defaults of the crash retries.
const (
	defaultCrashRetries = 2
	defaultRestartWait  = 60 * time.Second
	// restartPoll* pace the dials that wait for the function.
	restartPollFirst = 50 * time.Millisecond
	restartPollMax   = time.Second
	restartDial      = time.Second
	// maxHeldBody is the most kept of an answer held back.
	maxHeldBody = 4 << 10
)

func (s *Sidecar) crashRetries() int { return max(0, s.cfg.FunctionCrashRetries) }

func (s *Sidecar) restartWait() time.Duration {
	if s.cfg.FunctionRestartWait > 0 {
		return s.cfg.FunctionRestartWait
	}
	return defaultRestartWait
}

// attemptTrace is what one attempt's proxy request saw.
type attemptTrace struct {
	mu       sync.Mutex
	addr     string // the function's address the proxy asked a connection to
	answered atomic.Bool
}

func (a *attemptTrace) clientTrace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GetConn: func(hostPort string) {
			a.mu.Lock()
			a.addr = hostPort
			a.mu.Unlock()
		},
		GotFirstResponseByte: func() { a.answered.Store(true) },
	}
}

// target is the address the proxy dialled, "" if it asked for none.
func (a *attemptTrace) target() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.addr
}

// noAnswer: the proxy tried the function and no response came from it.
func (a *attemptTrace) noAnswer() bool { return a.target() != "" && !a.answered.Load() }

// Attempt states.
const (
	attemptPending = iota // nothing answered yet
	attemptPassed         // the function's answer goes through
	attemptHeld           // the proxy's own answer, held back
)

// attemptWriter is the proxy's writer for one attempt: the function's
// answer passes to w; an answer the proxy writes without one (its error
// handler's) is held back, and the response's header is as it was before
// the attempt, so that the next attempt starts clean.
type attemptWriter struct {
	w      http.ResponseWriter
	trace  *attemptTrace
	before http.Header // the response's header as the attempt began
	state  int
	// The answer held back.
	code   int
	header http.Header
	body   []byte
}

func newAttemptWriter(w http.ResponseWriter) *attemptWriter {
	return &attemptWriter{w: w, trace: &attemptTrace{}, before: w.Header().Clone()}
}

// request is this attempt's request: r with a fresh body and the trace.
func (a *attemptWriter) request(r *http.Request, body []byte) *http.Request {
	r2 := r.Clone(httptrace.WithClientTrace(r.Context(), a.trace.clientTrace()))
	r2.Body = io.NopCloser(bytes.NewReader(body))
	return r2
}

func (a *attemptWriter) Header() http.Header {
	if a.state == attemptHeld {
		return a.header
	}
	return a.w.Header()
}

func (a *attemptWriter) WriteHeader(code int) {
	switch {
	case a.state == attemptHeld:
		return
	case a.state == attemptPassed, code >= 100 && code < 200 && code != http.StatusSwitchingProtocols:
		a.w.WriteHeader(code)
		return
	case a.trace.noAnswer():
		// The proxy's own answer: held back, and the header it set on
		// the way taken off the response.
		a.state, a.code = attemptHeld, code
		h := a.w.Header()
		a.header = h.Clone()
		clear(h)
		maps.Copy(h, a.before)
		return
	}
	a.state = attemptPassed
	a.w.WriteHeader(code)
}

func (a *attemptWriter) Write(b []byte) (int, error) {
	if a.state == attemptPending {
		a.WriteHeader(http.StatusOK)
	}
	if a.state == attemptHeld {
		if room := maxHeldBody - len(a.body); room > 0 {
			a.body = append(a.body, b[:min(len(b), room)]...)
		}
		return len(b), nil
	}
	return a.w.Write(b)
}

// Flush sends what the function wrote so far.
func (a *attemptWriter) Flush() {
	if a.state == attemptPending {
		a.WriteHeader(http.StatusOK)
	}
	if a.state == attemptPassed {
		_ = http.NewResponseController(a.w).Flush()
	}
}

// Unwrap gives http.ResponseController the writer underneath.
func (a *attemptWriter) Unwrap() http.ResponseWriter { return a.w }

// died: the proxy tried the function and got no answer from it (the
// connection failed: refused, reset, closed before a response).
func (a *attemptWriter) died() bool {
	return a.state == attemptHeld || a.state == attemptPending && a.trace.noAnswer()
}

// pass writes the answer held back, as the proxy made it.
func (a *attemptWriter) pass() {
	if a.state != attemptHeld {
		return
	}
	h := a.w.Header()
	clear(h)
	maps.Copy(h, a.header)
	a.state = attemptPassed
	a.w.WriteHeader(a.code)
	_, _ = a.w.Write(a.body)
}

// reason is the transport error the proxy answered with, if it said one.
func (a *attemptWriter) reason() string {
	return strings.TrimSpace(string(a.body))
}

// attempts is "1 attempt", "n attempts".
func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return strconv.Itoa(n) + " attempts"
}

// errRestartWait: the function did not accept connections again in time.
var errRestartWait = errors.New("not accepting connections again")

// waitAccepting waits until addr accepts a TCP connection: dials spaced
// from restartPollFirst, doubling up to restartPollMax, for at most
// limit and while ctx lives.
func waitAccepting(ctx context.Context, addr string, limit time.Duration) error {
	ctx, cancel := context.WithTimeoutCause(ctx, limit, fmt.Errorf("%w within %v", errRestartWait, limit))
	defer cancel()
	d := net.Dialer{Timeout: restartDial}
	delay := restartPollFirst
	for {
		// The first dial waits too: the dead process's listener may
		// outlive its connections by a moment.
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		if c, err := d.DialContext(ctx, "tcp", addr); err == nil {
			_ = c.Close()
			return nil
		}
		delay = min(2*delay, restartPollMax)
	}
}
