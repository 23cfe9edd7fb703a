package ziptrail

import (
	"container/list"
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// The function server's idempotency records (Python: ziptrail/_idempotency.py).
//
// The pod's sidecar (queue-proxy-zl) records every invocation's answer
// under its idempotency key and answers a duplicate delivery from that
// record, but its records live in its memory: a sidecar restarted after a
// crash forwards a resent key to the function again. So FunctionHandler
// keeps its own record per key too, and a key runs at most once per
// function process:
//
//   - a delivery whose key is recorded gets the recorded answer (status,
//     the headers the server set, body) without running the handler; one
//     whose key is running waits for that run and gets its answer;
//   - the answer is recorded before it is written: an answer its (dead)
//     caller never got is still recorded;
//   - bounded: at most recordKeys keys and recordBytes bytes of answers,
//     oldest first out; a record expires recordTTL after its run ended
//     (the sidecar's default object TTL). An answer over maxRecordedAnswer
//     bytes is not recorded: its key is forgotten, and a later resend runs
//     again (deliveries already waiting for that run still get its answer);
//   - a run that ended without an answer (the handler panicked) is
//     forgotten: its waiters, and later deliveries, run the key again.
const (
	recordKeys        = 4096
	recordBytes       = 64 << 20
	maxRecordedAnswer = 16 << 20
	recordTTL         = 10 * time.Minute
)

// fnAnswer is what one run of an invocation answered.
type fnAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a *fnAnswer) size() int64 {
	n := int64(len(a.body)) + 64
	for k, vs := range a.header {
		n += int64(len(k))
		for _, v := range vs {
			n += int64(len(v)) + 16
		}
	}
	return n
}

// write sends the answer; replayed adds invocation.HeaderReplayed (the
// handler did not run for this delivery).
func (a *fnAnswer) write(w http.ResponseWriter, replayed bool) {
	h := w.Header()
	for k, vs := range a.header {
		h[k] = append([]string(nil), vs...)
	}
	if replayed {
		h.Set(invocation.HeaderReplayed, "1")
	}
	h.Set("Content-Length", strconv.Itoa(len(a.body)))
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body) // a caller gone by now has lost it: it is recorded
}

// fnRecord is one key: running until done is closed, then ans is its
// answer (nil: the run ended without one; run the key again).
type fnRecord struct {
	key     string
	done    chan struct{}
	ans     *fnAnswer
	bytes   int64
	expires time.Time
	elem    *list.Element // in fnRecords.order once recorded
}

// fnRecords are a function process's idempotency records. No lock is held
// while a handler runs: a run owns its record and closes done when it ends.
type fnRecords struct {
	maxKeys   int
	maxBytes  int64
	maxAnswer int
	ttl       time.Duration
	now       func() time.Time
	// waiting, when set (tests), learns of a delivery that starts waiting
	// for the run of its key.
	waiting func(key string)

	mu    sync.Mutex
	keys  map[string]*fnRecord // running and recorded
	order *list.List           // recorded, oldest (first to expire) first
	bytes int64
}

func newFnRecords() *fnRecords {
	return &fnRecords{maxKeys: recordKeys, maxBytes: recordBytes, maxAnswer: maxRecordedAnswer, ttl: recordTTL, now: time.Now,
		keys: map[string]*fnRecord{}, order: list.New()}
}

// acquire returns the record the caller runs (then finish or abandon it),
// or the answer of the key's run to replay; a delivery of a key that is
// running waits for it, until ctx ends (then neither: the caller left).
func (r *fnRecords) acquire(ctx context.Context, key string) (run *fnRecord, ans *fnAnswer) {
	for {
		r.mu.Lock()
		r.expireLocked()
		rec := r.keys[key]
		if rec == nil {
			rec = &fnRecord{key: key, done: make(chan struct{})}
			r.keys[key] = rec
			r.evictLocked()
			r.mu.Unlock()
			return rec, nil
		}
		r.mu.Unlock()
		select {
		case <-rec.done:
		default:
			if r.waiting != nil {
				r.waiting(key)
			}
			select {
			case <-rec.done:
			case <-ctx.Done():
				return nil, nil
			}
		}
		if rec.ans != nil { // written before done was closed
			return nil, rec.ans
		}
		// That run ended without an answer: this delivery may run the key.
	}
}

// finish records rec's answer and wakes the deliveries waiting for it.
func (r *fnRecords) finish(rec *fnRecord, ans *fnAnswer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec.ans = ans
	if r.keys[rec.key] == rec {
		if len(ans.body) > r.maxAnswer {
			delete(r.keys, rec.key) // not recorded: a resend runs again
		} else {
			rec.bytes, rec.expires = ans.size(), r.now().Add(r.ttl)
			rec.elem = r.order.PushBack(rec)
			r.bytes += rec.bytes
			r.evictLocked()
		}
	}
	close(rec.done)
}

// abandon forgets a run that ended without an answer (its handler did not
// run, or panicked); its waiters run the key again.
func (r *fnRecords) abandon(rec *fnRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys[rec.key] == rec {
		delete(r.keys, rec.key)
	}
	close(rec.done)
}

// usage is the number of keys (running and recorded) and the bytes
// recorded.
func (r *fnRecords) usage() (int, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.keys), r.bytes
}

func (r *fnRecords) removeLocked(rec *fnRecord) {
	r.order.Remove(rec.elem)
	rec.elem = nil
	delete(r.keys, rec.key)
	r.bytes -= rec.bytes
}

func (r *fnRecords) expireLocked() {
	now := r.now()
	for e := r.order.Front(); e != nil; e = r.order.Front() {
		rec := e.Value.(*fnRecord)
		if now.Before(rec.expires) {
			return
		}
		r.removeLocked(rec)
	}
}

// evictLocked frees the oldest recorded keys while over a cap; running
// ones stay (their duplicates wait for them).
func (r *fnRecords) evictLocked() {
	for (len(r.keys) > r.maxKeys || r.bytes > r.maxBytes) && r.order.Len() > 0 {
		r.removeLocked(r.order.Front().Value.(*fnRecord))
	}
}
