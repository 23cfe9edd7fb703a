package sidecar

import (
	"container/list"
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Idempotency records (docs/queue-proxy-zl.md, "Idempotency keys"): every
// invocation has a key (invocation.IdempotencyKey: session, invocation id,
// attempt). The sidecar remembers the outcome of each key it ran — status,
// headers, body as the caller got them — and answers a duplicate delivery
// of the key (a dispatcher's retry after a lost answer, a resend by a new
// operator owner) from that record instead of running the function again;
// a duplicate that arrives while the first delivery runs waits for it.
// Records are per session: freed when the operator drops the session, or
// an object TTL after they were made, or — oldest first, counted in
// ziptrail_idempotency_evictions_total — when the sidecar holds more than
// its caps of keys or bytes.

// maxRecordedBody is the largest answer recorded: the dispatcher keeps no
// more of a response by default (dispatch.Options.MaxBody), nor does a
// delegated invocation report a larger return value.
const maxRecordedBody = 1 << 20

// Default caps of the records of one sidecar.
const (
	defaultRecordKeys  = 65536
	defaultRecordBytes = 64 << 20
)

var (
	replays = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_idempotency_duplicates_total",
		Help: "Duplicate deliveries of an invocation's idempotency key, by how they were answered: replayed (from the record), " +
			"waited (for the delivery still running, then from its record), unrecorded (the first outcome could not be recorded: 409).",
	}, []string{"answer"})
	evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_idempotency_evictions_total",
		Help: "Idempotency records freed before their session ended, by reason: cap (the sidecar's key or byte cap), ttl (an object TTL old).",
	}, []string{"reason"})
	recordsDesc     = prometheus.NewDesc("ziptrail_idempotency_records", "Idempotency keys whose outcome this sidecar records or runs.", nil, nil)
	recordBytesDesc = prometheus.NewDesc("ziptrail_idempotency_record_bytes", "Bytes of the recorded outcomes.", nil, nil)
)

func init() {
	prometheus.MustRegister(replays, evictions)
	for _, a := range []string{"replayed", "waited", "unrecorded"} {
		replays.WithLabelValues(a) // exported from 0
	}
	evictions.WithLabelValues("cap")
	evictions.WithLabelValues("ttl")
}

// outcome is what the caller of one delivery got.
type outcome struct {
	status int
	header http.Header
	body   []byte
}

func (o *outcome) size() int64 {
	n := int64(len(o.body)) + 64
	for k, vs := range o.header {
		n += int64(len(k))
		for _, v := range vs {
			n += int64(len(v)) + 16
		}
	}
	return n
}

// record is one key: running until done is closed, then out is its
// outcome (nil: none could be recorded).
type record struct {
	session, key string
	done         chan struct{}
	out          *outcome
	unrecorded   bool          // the run ended without an outcome to replay
	bytes        int64         // of out
	expires      time.Time     // once done
	elem         *list.Element // in records.order once done
}

// records are a sidecar's idempotency records.
type records struct {
	maxKeys  int
	maxBytes int64
	ttl      time.Duration
	// waiting, when set (tests), learns of a delivery that starts waiting
	// for the one running its key.
	waiting func(key string)

	mu       sync.Mutex
	sessions map[string]map[string]*record // session → key → record
	order    *list.List                    // finished records, oldest first (each *record)
	keys     int
	bytes    int64
}

func newRecords(maxKeys int, maxBytes int64, ttl time.Duration) *records {
	if maxKeys <= 0 {
		maxKeys = defaultRecordKeys
	}
	if maxBytes <= 0 {
		maxBytes = defaultRecordBytes
	}
	if ttl <= 0 {
		ttl = 10 * time.Minute
	}
	return &records{maxKeys: maxKeys, maxBytes: maxBytes, ttl: ttl, sessions: map[string]map[string]*record{}, order: list.New()}
}

// acquire returns the record the caller runs and fills (finish or
// abandon), or the outcome of an earlier delivery of the key to answer
// with. A delivery of a key that is running waits for it (until ctx ends:
// then ctx's error). unrecorded is true when the key ran but its outcome
// could not be recorded.
func (r *records) acquire(ctx context.Context, session, key string) (run *record, out *outcome, unrecorded bool, err error) {
	waited := false
	for {
		r.mu.Lock()
		keys := r.sessions[session]
		rec := keys[key]
		if rec == nil {
			if keys == nil {
				keys = map[string]*record{}
				r.sessions[session] = keys
			}
			rec = &record{session: session, key: key, done: make(chan struct{})}
			keys[key] = rec
			r.keys++
			r.evictLocked()
			r.mu.Unlock()
			return rec, nil, false, nil
		}
		done := rec.done
		r.mu.Unlock()
		select {
		case <-done:
		default:
			waited = true
			if r.waiting != nil {
				r.waiting(key)
			}
			select {
			case <-done:
			case <-ctx.Done():
				return nil, nil, false, ctx.Err()
			}
		}
		r.mu.Lock()
		out, unrecorded := rec.out, rec.unrecorded
		abandoned := out == nil && !unrecorded
		r.mu.Unlock()
		if abandoned {
			continue // the first delivery did not run the function: this one may
		}
		switch {
		case unrecorded:
			replays.WithLabelValues("unrecorded").Inc()
		case waited:
			replays.WithLabelValues("waited").Inc()
		default:
			replays.WithLabelValues("replayed").Inc()
		}
		return nil, out, unrecorded, nil
	}
}

// finish records rec's outcome (nil: the function ran, but what it
// answered cannot be replayed) and wakes the deliveries waiting for it.
func (r *records) finish(rec *record, out *outcome, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec.out, rec.unrecorded = out, out == nil
	if out != nil {
		rec.bytes = out.size()
	}
	rec.expires = now.Add(r.ttl)
	close(rec.done)
	if r.sessions[rec.session][rec.key] != rec {
		return // dropped while it ran
	}
	r.bytes += rec.bytes
	rec.elem = r.order.PushBack(rec)
	r.evictLocked()
}

// abandon forgets rec: its delivery did not run the function (its inputs
// could not be resolved), so a later delivery of the key may.
func (r *records) abandon(rec *record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(rec.done)
	if keys := r.sessions[rec.session]; keys[rec.key] == rec {
		r.removeLocked(rec)
	}
}

// drop frees a session's records (the operator collected the session).
func (r *records) drop(session string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.sessions[session] {
		r.removeLocked(rec)
	}
	delete(r.sessions, session)
}

// sweep frees the records an object TTL old.
func (r *records) sweep(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for e := r.order.Front(); e != nil; e = r.order.Front() {
		rec := e.Value.(*record)
		if now.Before(rec.expires) {
			return
		}
		r.removeLocked(rec)
		evictions.WithLabelValues("ttl").Inc()
	}
}

// evictLocked frees the oldest finished records while over a cap; running
// ones are never freed (their duplicates wait for them).
func (r *records) evictLocked() {
	for (r.keys > r.maxKeys || r.bytes > r.maxBytes) && r.order.Len() > 0 {
		r.removeLocked(r.order.Front().Value.(*record))
		evictions.WithLabelValues("cap").Inc()
	}
}

func (r *records) removeLocked(rec *record) {
	keys := r.sessions[rec.session]
	if keys[rec.key] != rec {
		return
	}
	delete(keys, rec.key)
	if len(keys) == 0 {
		delete(r.sessions, rec.session)
	}
	r.keys--
	if rec.elem != nil {
		r.order.Remove(rec.elem)
		rec.elem = nil
		r.bytes -= rec.bytes
	}
}

// usage is the number of keys and the bytes recorded.
func (r *records) usage() (int, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.keys, r.bytes
}

// replay answers a duplicate delivery with the recorded outcome.
func replay(w http.ResponseWriter, key string, out *outcome, unrecorded bool) {
	h := w.Header()
	h.Set(invocation.HeaderIdempotencyKey, key)
	h.Set(invocation.HeaderReplayed, "1")
	if unrecorded {
		http.Error(w, "ziptrail: invocation "+key+" already ran here and its answer could not be recorded "+
			"(larger than "+strconv.Itoa(maxRecordedBody)+" bytes, or cut): the function is not run twice for one key", http.StatusConflict)
		return
	}
	for k, vs := range out.header {
		h[k] = append([]string(nil), vs...)
	}
	h.Set(invocation.HeaderIdempotencyKey, key)
	h.Set(invocation.HeaderReplayed, "1")
	h.Set("Content-Length", strconv.Itoa(len(out.body)))
	w.WriteHeader(out.status)
	_, _ = w.Write(out.body)
}

// recorder passes an invocation's answer to its caller and keeps a copy
// (up to maxRecordedBody) for the record. Once the caller is gone (a
// write fails) it goes on taking the answer, so the function finishes
// and its outcome is recorded and reported: nothing depends on the
// caller's connection.
type recorder struct {
	w           http.ResponseWriter
	status      int
	header      http.Header // as sent
	body        []byte
	over        bool // the body exceeded maxRecordedBody
	callerGone  bool
	wroteHeader bool
}

func (r *recorder) Header() http.Header { return r.w.Header() }

func (r *recorder) WriteHeader(code int) {
	if r.wroteHeader {
		return
	}
	r.wroteHeader, r.status = true, code
	r.header = r.w.Header().Clone()
	r.w.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	if !r.over {
		if len(r.body)+len(b) > maxRecordedBody {
			r.over, r.body = true, nil
		} else {
			r.body = append(r.body, b...)
		}
	}
	if !r.callerGone {
		if _, err := r.w.Write(b); err != nil {
			r.callerGone = true
		}
	}
	return len(b), nil
}

// Flush sends what was written so far, while the caller is there.
func (r *recorder) Flush() {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	if !r.callerGone {
		if err := http.NewResponseController(r.w).Flush(); err != nil {
			r.callerGone = true
		}
	}
}

// outcome is what was answered, nil when it cannot be replayed (too large).
func (r *recorder) outcome() *outcome {
	if r.over {
		return nil
	}
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	h := r.header
	h.Del("Content-Length")
	h.Del(invocation.HeaderReplayed)
	return &outcome{status: r.status, header: h, body: r.body}
}
