package sidecar

// The invocation handler queue-proxy-zl puts in front of the function
// (Wrap): decode and check the envelope, resolve its inputs, call the
// function, externalize its outputs, report.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Wrap returns the handler chain extension: resolve inputs on the way in,
// turn large outputs into references on the way out. It is a chain of
// small stages, one concern each, as Knative's sharedmain builds its own
// handlers: each takes the invocation (a passage) and hands it on.
//
// Trust: an envelope from outside the pod must not name files (it is
// refused with 400); the inputs this sidecar pulls get fresh random names
// in the object directory, the only paths the SDKs open.
//
// Memory: a response passes through as the function writes it, except a
// 200 with outputs (OutputsContentType), which is read whole to rewrite
// its large objects into references: at most MaxOutputsBytes each, and all
// of them together at most the larger of MemoryLimit and MaxOutputsBytes,
// waiting up to PutTimeout for room.
func (s *Sidecar) Wrap(next http.Handler) http.Handler {
	h := s.callFunction(next) // the function: crash retries, outputs, delegation, report
	h = s.withInputs(h)       // its inputs resolved, its envelope re-encoded, its context
	h = s.withStartReport(h)  // a delegated invocation's start, held for its outcome
	h = s.withRecord(h)       // its idempotency key: a duplicate answered from the record
	return s.envelopes(next, h)
}

// passage is an invocation on its way through Wrap's stages.
type passage struct {
	env     *invocation.Envelope
	started *startReport // its start report, held (delegated firing); nil: none
	body    []byte       // the envelope as the function gets it
	ran     bool         // the function was called
}

// stage is one concern of Wrap's chain: it handles c and hands it on.
type stage func(w http.ResponseWriter, r *http.Request, c *passage)

// envelopes passes a stock request to next exactly as queue-proxy does,
// and hands an invocation's envelope, fenced, decoded and checked, to h.
func (s *Sidecar) envelopes(next http.Handler, h stage) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !invocation.IsEnvelope(r.Header.Get("Content-Type")) {
			next.ServeHTTP(w, r)
			return
		}
		// A superseded engine owner's invocation is refused before
		// anything else (fence.go): its body is not read, the function
		// does not run, its key is not recorded.
		if !s.checkFence(w, r) {
			return
		}
		env, err := invocation.Decode(r.Body)
		if err == nil {
			err = env.RefusePaths()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h(w, r, &passage{env: env})
	})
}

// withRecord runs an invocation's idempotency key once (idempotency.go):
// the key is this sidecar's to derive, the function gets it, and every
// answer echoes it, which tells the caller this sidecar answers a
// duplicate from its record. A key whose function never ran (its inputs
// could not be resolved) is left for a later delivery.
func (s *Sidecar) withRecord(h stage) stage {
	return func(w http.ResponseWriter, r *http.Request, c *passage) {
		key := c.env.Key()
		c.env.IdempotencyKey = key
		w.Header().Set(invocation.HeaderIdempotencyKey, key)
		rec, out, unrecorded, err := s.records.acquire(r.Context(), c.env.Session, key)
		if err != nil {
			return // its caller left while it waited for the delivery that runs the key
		}
		if rec == nil {
			replay(w, key, out, unrecorded)
			return
		}
		done := false
		defer func() {
			if !done {
				// A panic below (the function's answer was cut): the key
				// ran and its answer is unknown; its end is reported
				// failed, for the engine's re-execution rules.
				s.records.finish(rec, nil, time.Now())
				s.reportOutcome(c.env, c.started, http.StatusBadGateway, nil, nil, 0, "the function's answer was cut off")
			}
		}()
		rw := &recorder{w: w}
		h(rw, r, c)
		done = true
		if !c.ran {
			s.records.abandon(rec)
			return
		}
		s.records.finish(rec, rw.outcome(), time.Now())
	}
}

// withStartReport holds a delegated invocation's start report for its
// outcome (holdStarted); an end without a report of its own sends it.
func (s *Sidecar) withStartReport(h stage) stage {
	return func(w http.ResponseWriter, r *http.Request, c *passage) {
		c.started = s.holdStarted(c.env)
		defer c.started.flush(s)
		h(w, r, c)
	}
}

// withInputs gives the invocation its context (invocationContext), pulls
// its referenced inputs into files of the object directory, removed once
// the function is done, and encodes the envelope the function gets.
func (s *Sidecar) withInputs(h stage) stage {
	return func(w http.ResponseWriter, r *http.Request, c *passage) {
		ctx, cancel := s.invocationContext(r, c.env)
		defer cancel()
		files, err := s.resolve(ctx, c.env)
		defer removeAll(files)
		if err != nil {
			// The function does not run: a later delivery of the key may.
			// 424: the invocation cannot run without its inputs; the
			// header names the error class for the caller's SDK.
			msg := "ziptrail: resolve inputs: " + err.Error()
			if c.env.Delegated && s.ctl != nil {
				// A delegated invocation is this pod's once its start is
				// reported: its failure is this sidecar's to report too
				// (the producer's would be refused as another pod's), in
				// one message with the start, before the answer.
				s.reportOutcome(c.env, c.started, http.StatusFailedDependency, nil, nil, 0, msg)
				w.Header().Set(headerReported, "1")
			} else {
				c.started.flush(s)
			}
			if reason := localapi.ReasonOf(err); reason != "" {
				w.Header().Set(invocation.HeaderErrorReason, reason)
			}
			http.Error(w, msg, http.StatusFailedDependency)
			return
		}
		body, err := json.Marshal(c.env)
		if err != nil {
			http.Error(w, "ziptrail: encode the envelope: "+err.Error(), http.StatusInternalServerError)
			return
		}
		// The body is sent again, whole, if the function's process dies
		// before it answers (crash.go): each attempt reads it anew.
		r2 := r.Clone(ctx)
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		r2.Header.Set("Content-Length", strconv.Itoa(len(body)))
		c.body = body
		h(w, r2, c)
	}
}

// callFunction calls the function (serveFunction); the invocation's group
// memberships end with it.
func (s *Sidecar) callFunction(next http.Handler) stage {
	return func(w http.ResponseWriter, r *http.Request, c *passage) {
		c.ran = true
		s.serveFunction(w, r, c.body, next, c.env, c.started)
		s.msgs.InvocationEnded(c.env.Invocation, r.Context().Err() != nil)
	}
}

// invocationContext is the context an invocation runs in: not its
// request's, since an outcome must not depend on its caller's connection
// (the operator's HTTP client may go away on a restart or a handover, a
// delegated invocation's producer pod may be terminated once its outputs
// are safe), but one that ends at the revision's timeout. The function
// finishes, its outcome is recorded under its idempotency key and, with a
// control stream, reported to whichever operator owns the session.
func (s *Sidecar) invocationContext(r *http.Request, env *invocation.Envelope) (context.Context, context.CancelFunc) {
	timeout := s.cfg.RevisionTimeout
	if timeout <= 0 {
		timeout = 300 * time.Second
	}
	return context.WithTimeout(context.WithoutCancel(r.Context()), timeout)
}

// serveFunction runs the function's handler, streaming its response or,
// for outputs, buffering (bounded) and rewriting it. r's body is body; a
// function whose process died before it answered gets r again (crash.go).
func (s *Sidecar) serveFunction(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler, env *invocation.Envelope, started *startReport) {
	// Every invocation's outcome is reported over the control stream: a
	// delegated one's because the operator does not read its response
	// (delegate.go), an engine-dispatched one's so that the operator that
	// owns the session learns it even when the HTTP client that sent it
	// is gone (a restart, a handover); the engine applies the outcome
	// once, whichever arrives first. An engine-dispatched one's report is
	// kept unsent, named in the answer, until the operator releases it
	// (controlclient/kept.go): the dispatcher's answer is the first copy.
	report := s.ctl != nil
	rep := &outcomeReport{started: started}
	defer rep.end(s) // an answer that ended before its report: nothing kept
	ow := &outputsWriter{w: w, ctx: r.Context(), limit: s.maxOutputs(), budget: s.outputsBudget(), wait: s.putTimeout(), all: report,
		// Objects the function sent through the local API are reported on
		// their own: the response says how many, so none is missed.
		head: func(h http.Header) {
			h.Del(invocation.HeaderStaleOwner) // this sidecar's to say, not the function's
			h.Del(invocation.HeaderOutcomeKept)
			s.api.MarkOutputsSent(h, env.Session, env.Invocation)
			if report {
				h.Set(headerReported, "1")
				if !env.Delegated && r.Header.Get(invocation.HeaderKeepReport) != "" {
					rep.kept = s.ctl.Reserve()
					h.Set(invocation.HeaderOutcomeKept, invocation.FormatKept(s.cfg.Pod, rep.kept))
				}
			}
		}}
	defer ow.release()
	fail := func(code int, msg string) {
		w.Header().Del("Content-Length")
		w.Header().Del("Content-Type")
		w.Header().Del(invocation.HeaderOutcomeKept) // a failure is reported at once
		http.Error(w, msg, code)
		if report {
			s.reportOutcome(env, started, code, nil, nil, 0, msg)
		}
	}
	for died := 0; ; {
		at := newAttemptWriter(ow)
		func() {
			// A reverse proxy aborts (panics with ErrAbortHandler) when a
			// write fails; for outputs this sidecar refused, the caller
			// still gets the reason below.
			defer func() {
				if v := recover(); v != nil && (v != http.ErrAbortHandler || ow.err == nil) {
					panic(v)
				}
			}()
			next.ServeHTTP(at, at.request(r, body))
		}()
		if !at.died() {
			break
		}
		// The function's process died before it answered.
		died++
		if r.Context().Err() != nil || s.crashRetries() == 0 {
			at.pass() // the revision's timeout, or no retries: the proxy's answer
			break
		}
		cause := ""
		if why := at.reason(); why != "" {
			cause = ": " + why
		}
		if died > s.crashRetries() {
			fail(http.StatusBadGateway, fmt.Sprintf("ziptrail: the function's process exited before answering (%s)%s", attempts(died), cause))
			return
		}
		if err := waitAccepting(r.Context(), at.trace.target(), s.restartWait()); err != nil {
			fail(http.StatusBadGateway, fmt.Sprintf("ziptrail: the function's process exited before answering (%s)%s; "+
				"waiting for it to restart: %v", attempts(died), cause, err))
			return
		}
		functionCrashRetries.Inc()
	}
	if !ow.buffering {
		if !ow.wroteHeader {
			ow.WriteHeader(http.StatusOK)
		}
		if report {
			rep.outcome(s, env, ow.code, nil, nil, 0)
		}
		return
	}
	if ow.err != nil {
		code := http.StatusBadGateway
		if errors.Is(ow.err, errOutputsWait) {
			code = http.StatusInsufficientStorage
		}
		fail(code, "ziptrail: function outputs: "+ow.err.Error())
		return
	}
	sentLocally := invocation.OutputsSent(w.Header())
	if !invocation.IsOutputs(w.Header().Get("Content-Type")) { // a delegated invocation's plain return value
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(ow.buf.Bytes())
		rep.outcome(s, env, http.StatusOK, nil, ow.buf.Bytes(), sentLocally)
		return
	}
	outs, err := invocation.DecodeOutputs(ow.buf.Bytes())
	if err != nil {
		fail(http.StatusBadGateway, "ziptrail: function outputs: "+err.Error())
		return
	}
	// What was fired locally is this sidecar's to say, not the function's.
	forged := false
	for i := range outs.Objects {
		if outs.Objects[i].FiredLocally != nil {
			outs.Objects[i].FiredLocally, forged = nil, true
		}
	}
	out, err := s.externalize(r.Context(), env, outs, ow.buf.Bytes())
	if err != nil {
		fail(http.StatusInsufficientStorage, "ziptrail: store outputs: "+err.Error())
		return
	}
	if s.fireDelegated(env, outs) || forged {
		if out, err = json.Marshal(outs); err != nil {
			fail(http.StatusInternalServerError, "ziptrail: encode outputs: "+err.Error())
			return
		}
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	if report {
		rep.outcome(s, env, http.StatusOK, outs, nil, sentLocally)
	}
}

func removeAll(paths []string) {
	for _, p := range paths {
		_ = os.Remove(p)
	}
}

// maxOutputs is the cap of one response with outputs: MaxOutputsBytes,
// default invocation.MaxEnvelopeBytes.
func (s *Sidecar) maxOutputs() int64 {
	if s.cfg.MaxOutputsBytes > 0 {
		return s.cfg.MaxOutputsBytes
	}
	return invocation.MaxEnvelopeBytes
}

// outputsBudget bounds the bytes of all responses with outputs being read
// at once: the pod's object memory, or one response's cap if that is more
// (a pod with a fast tier spills outputs larger than its memory).
func (s *Sidecar) outputsBudget() *semaphore.Weighted {
	s.outputsOnce.Do(func() { s.outputs = semaphore.NewWeighted(max(s.cfg.MemoryLimit, s.maxOutputs())) })
	return s.outputs
}

// resolve pulls every referenced input into a file of its own, with a
// fresh random name, in the object directory; it returns the files made.
func (s *Sidecar) resolve(ctx context.Context, env *invocation.Envelope) ([]string, error) {
	var refs []int
	for i, o := range env.Objects {
		if o.Ref != "" && o.Inline == nil {
			refs = append(refs, i)
		}
	}
	if len(refs) == 0 {
		return nil, nil
	}
	if err := s.waitKeys(ctx); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.cfg.ShmDir, 0o755); err != nil {
		return nil, fmt.Errorf("object directory: %w", err)
	}
	files := make([]string, len(refs))
	for n, i := range refs {
		env.Objects[i].Path = invocation.NewInputName()
		files[n] = filepath.Join(s.cfg.ShmDir, env.Objects[i].Path)
	}
	errs := make(chan error, len(refs))
	for n, i := range refs {
		go func() {
			o := &env.Objects[i]
			f, err := os.OpenFile(files[n], os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644) // read-write: the pull maps it
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			_, err = s.pullTo(ctx, o.Ref, func(size int64) (io.WriterAt, error) { return f, f.Truncate(size) })
			if err != nil {
				errs <- fmt.Errorf("%s/%s: %w", o.Bucket, o.Key, err)
				return
			}
			errs <- nil
		}()
	}
	var all []error
	for range refs {
		all = append(all, <-errs)
	}
	return files, errors.Join(all...)
}

// externalize moves large inline outputs into the store and references them.
// body is returned unchanged when no object needs it. On failure nothing
// stays stored (the caller gets an error, not the references).
func (s *Sidecar) externalize(ctx context.Context, env *invocation.Envelope, outs *invocation.Outputs, body []byte) (_ []byte, err error) {
	var stored []string
	defer func() {
		if err != nil {
			for _, id := range stored {
				s.Store.Remove(id)
			}
		}
	}()
	changed := false
	for i := range outs.Objects {
		o := &outs.Objects[i]
		if len(o.Inline) <= s.cfg.InlineThreshold {
			continue
		}
		if err := s.waitKeys(ctx); err != nil {
			return nil, err
		}
		id := fmt.Sprintf("%s/%s/%s/%d", env.Session, o.Bucket, o.Key, s.seq.Add(1))
		exp := time.Now().Add(s.cfg.ObjectTTL)
		putCtx, cancel := context.WithTimeout(ctx, s.putTimeout())
		// Outputs may be read by several targets: they live until the
		// session is collected or the TTL passes.
		err := s.Store.Put(putCtx, store.Meta{ID: id, Session: env.Session, Bucket: o.Bucket, Key: o.Key, Reads: math.MaxUint32, Expires: exp}, o.Inline)
		cancel()
		if err != nil {
			return nil, err
		}
		stored = append(stored, id)
		r, err := s.keys.Load().Seal(s.withNode(ref.Record{Addr: s.addr(), Key: id, Expires: exp, Reads: math.MaxUint32}))
		if err != nil {
			return nil, err
		}
		o.Size, o.Ref, o.Inline = int64(len(o.Inline)), r, nil
		changed = true
	}
	if !changed {
		return body, nil
	}
	return json.Marshal(outs)
}
