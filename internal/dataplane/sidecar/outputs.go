package sidecar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// errOutputsWait: responses with outputs held the whole budget for
// longer than the put timeout.
var errOutputsWait = errors.New("store full: no memory to read them within the put timeout")

// outputsWriter passes the function's response through, except a 200
// with outputs, which it buffers for externalize: at most limit bytes,
// reserved from budget (waiting up to wait) before they are read.
type outputsWriter struct {
	w      http.ResponseWriter
	ctx    context.Context
	limit  int64
	budget *semaphore.Weighted
	wait   time.Duration
	head   func(http.Header) // adds to the response's header as it begins
	// all buffers every 200, outputs or not (a delegated invocation, whose
	// return value the sidecar reports itself).
	all bool

	code                   int // the function's status
	wroteHeader, buffering bool
	buf                    bytes.Buffer
	held                   int64 // bytes reserved from budget
	err                    error // why the outputs were refused
}

// Header is the real writer's: nothing is sent before WriteHeader, and
// trailers set after the body reach the caller.
func (o *outputsWriter) Header() http.Header { return o.w.Header() }

func (o *outputsWriter) WriteHeader(code int) {
	if o.wroteHeader {
		return
	}
	o.wroteHeader, o.code = true, code
	if o.head != nil {
		o.head(o.w.Header())
	}
	if code != http.StatusOK || !o.all && !invocation.IsOutputs(o.w.Header().Get("Content-Type")) {
		o.w.WriteHeader(code)
		return
	}
	o.buffering = true
	if n, err := strconv.ParseInt(o.w.Header().Get("Content-Length"), 10, 64); err == nil && n > 0 {
		if o.grow(n) == nil {
			o.buf.Grow(int(n))
		}
	}
}

func (o *outputsWriter) Write(b []byte) (int, error) {
	if !o.wroteHeader {
		o.WriteHeader(http.StatusOK)
	}
	if !o.buffering {
		return o.w.Write(b)
	}
	if o.err != nil {
		return 0, o.err
	}
	if need := int64(o.buf.Len()+len(b)) - o.held; need > 0 {
		if err := o.grow(need); err != nil {
			return 0, err
		}
	}
	return o.buf.Write(b)
}

// grow reserves n more bytes, within the cap and the budget.
func (o *outputsWriter) grow(n int64) error {
	if o.held+n > o.limit {
		o.err = fmt.Errorf("they exceed %d bytes; send large objects by reference (put) or raise ZIPTRAIL_MAX_OUTPUTS_BYTES", o.limit)
	} else {
		ctx, cancel := context.WithTimeoutCause(o.ctx, o.wait, errOutputsWait)
		err := o.budget.Acquire(ctx, n)
		cancel()
		if err == nil {
			o.held += n
			return nil
		}
		if errors.Is(context.Cause(ctx), errOutputsWait) {
			o.err = errOutputsWait
		} else {
			o.err = fmt.Errorf("waiting for memory to read them: %w", err)
		}
	}
	o.buf = bytes.Buffer{} // refused: free what was read
	return o.err
}

// release returns the reservation once the response was sent.
func (o *outputsWriter) release() {
	if o.held > 0 {
		o.budget.Release(o.held)
		o.held = 0
	}
}

// Flush sends what the function wrote so far (streamed responses only).
func (o *outputsWriter) Flush() {
	if !o.wroteHeader {
		o.WriteHeader(http.StatusOK)
	}
	if !o.buffering {
		_ = http.NewResponseController(o.w).Flush()
	}
}

// Unwrap gives http.ResponseController the real writer.
func (o *outputsWriter) Unwrap() http.ResponseWriter { return o.w }
