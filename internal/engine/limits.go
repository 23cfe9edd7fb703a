package engine

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// What a session holds, and what a namespace's sessions hold together, is
// bounded (Limits), so that the sidecars of one namespace cannot grow the
// engine's memory for every other namespace. A workflow's namespace is the
// part of its name before the first "/" (the operator names workflows
// namespace/name).
//
// What is counted, once per session for the session's life:
//
//   - objects: every distinct object (bucket/key) accepted, every later
//     invocation that sent an already accepted key (the engine remembers
//     it), every invocation learned of only from an event (a start or an
//     output of an invocation the engine did not issue), and the input;
//   - bytes: each of those objects' inline contents, bucket, key,
//     reference, producer, invocation id and metadata, and the arguments
//     an event brings for an invocation the engine did not issue.
//
// The count only grows while the session runs (an object fired on and
// forgotten by its trigger still counts), and all of it is given back when
// the session ends. An event that would take a session or its namespace
// over a limit fails that session at once (ActSessionFailed with Limit and
// a reason naming the limit; its objects are dropped): it cannot complete
// without the object, and ending it frees what it held. A resent event
// (an object already accepted from the same invocation) costs nothing.

// Limits bound the engine's state; zero (or negative) leaves a bound off.
type Limits struct {
	// SessionsPerNamespace bounds the running sessions of a namespace:
	// StartSession beyond it fails with a *LimitError.
	SessionsPerNamespace int64
	// ObjectsPerSession and BytesPerSession bound one session.
	ObjectsPerSession, BytesPerSession int64
	// ObjectsPerNamespace and BytesPerNamespace bound a namespace's
	// running sessions together.
	ObjectsPerNamespace, BytesPerNamespace int64
}

// Names of the limits, as the operator's flags and chart values name them.
const (
	LimitSessionsPerNamespace = "sessionsPerNamespace"
	LimitObjectsPerSession    = "objectsPerSession"
	LimitObjectsPerNamespace  = "objectsPerNamespace"
	LimitBytesPerSession      = "bytesPerSession"
	LimitBytesPerNamespace    = "bytesPerNamespace"
)

// LimitError is a start refused, or a session ended, by a limit.
type LimitError struct {
	Limit     string // LimitSessionsPerNamespace, ...
	Namespace string
	Session   string
	// Have is what the session or namespace held, Need what it asked for
	// more, Max the limit.
	Have, Need, Max int64
}

func (e *LimitError) Error() string {
	switch e.Limit {
	case LimitSessionsPerNamespace:
		return fmt.Sprintf("namespace %s has %d running sessions, the limit %s is %d", e.Namespace, e.Have, e.Limit, e.Max)
	case LimitObjectsPerSession:
		return fmt.Sprintf("session %s holds %d objects in the trigger engine, the limit %s is %d", e.Session, e.Have, e.Limit, e.Max)
	case LimitObjectsPerNamespace:
		return fmt.Sprintf("namespace %s holds %d objects in the trigger engine, the limit %s is %d (session %s asked for %d more)",
			e.Namespace, e.Have, e.Limit, e.Max, e.Session, e.Need)
	case LimitBytesPerSession:
		return fmt.Sprintf("session %s holds %d bytes in the trigger engine and asked for %d more, the limit %s is %d",
			e.Session, e.Have, e.Need, e.Limit, e.Max)
	case LimitBytesPerNamespace:
		return fmt.Sprintf("namespace %s holds %d bytes in the trigger engine, session %s asked for %d more, the limit %s is %d",
			e.Namespace, e.Have, e.Session, e.Need, e.Limit, e.Max)
	}
	return fmt.Sprintf("limit %s (%d) reached: %d held, %d more asked", e.Limit, e.Max, e.Have, e.Need)
}

// Usage is what a namespace's running sessions hold.
type Usage struct {
	Sessions, Objects, Bytes int64
}

// Pool accounts, per namespace, what the sessions of the engines sharing
// it hold, and enforces Limits: one Pool for every engine of an operator
// replica (the sharded engine runs one engine per bucket), so a limit per
// namespace holds across them. Safe for concurrent use.
type Pool struct {
	limits atomic.Pointer[Limits]
	mu     sync.Mutex
	ns     map[string]*usage
}

type usage struct {
	sessions, objects, bytes atomic.Int64
	detached                 bool // a released session's own, in no pool
}

// NewPool returns a pool enforcing l.
func NewPool(l Limits) *Pool {
	p := &Pool{ns: map[string]*usage{}}
	p.SetLimits(l)
	return p
}

// SetLimits changes the limits; what is held already stays.
func (p *Pool) SetLimits(l Limits) { p.limits.Store(&l) }

// Limits returns the limits in force.
func (p *Pool) Limits() Limits { return *p.limits.Load() }

// Usage is what namespace's running sessions hold now.
func (p *Pool) Usage(namespace string) Usage {
	u := p.usage(namespace)
	return Usage{Sessions: u.sessions.Load(), Objects: u.objects.Load(), Bytes: u.bytes.Load()}
}

// CheckStart reports whether namespace may start one more session now
// (a *LimitError when not): the check before reading a session's input.
// StartSession checks again, authoritatively.
func (p *Pool) CheckStart(namespace string) error {
	max := p.Limits().SessionsPerNamespace
	if n := p.usage(namespace).sessions.Load(); max > 0 && n >= max {
		return &LimitError{Limit: LimitSessionsPerNamespace, Namespace: namespace, Have: n, Need: 1, Max: max}
	}
	return nil
}

func (p *Pool) usage(namespace string) *usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := p.ns[namespace]
	if u == nil {
		u = &usage{}
		p.ns[namespace] = u
	}
	return u
}

// take adds n to c unless that passes max (> 0); it returns what c held.
func take(c *atomic.Int64, n, max int64) (int64, bool) {
	for {
		have := c.Load()
		if max > 0 && n > 0 && have+n > max {
			return have, false
		}
		if c.CompareAndSwap(have, have+n) {
			return have, true
		}
	}
}

// namespaceOf is a workflow's namespace: its name up to the first "/".
func namespaceOf(workflow string) string {
	ns, _, _ := strings.Cut(workflow, "/")
	return ns
}

// SetPool makes the engine account its sessions in p (shared with other
// engines); call it before the first session starts. New gives every
// engine a pool of its own without limits.
func (e *Engine) SetPool(p *Pool) { e.pool = p }

// Pool is the engine's pool.
func (e *Engine) Pool() *Pool { return e.pool }

// admit counts a new session of namespace and its input, or says which
// limit refuses it.
func (e *Engine) admit(s *session, input int64) *LimitError {
	l := e.pool.Limits()
	s.ns = e.pool.usage(namespaceOf(s.wf))
	if have, ok := take(&s.ns.sessions, 1, l.SessionsPerNamespace); !ok {
		return &LimitError{Limit: LimitSessionsPerNamespace, Namespace: namespaceOf(s.wf), Session: s.id, Have: have, Need: 1, Max: l.SessionsPerNamespace}
	}
	if err := e.charge(s, 1, input); err != nil {
		s.ns.sessions.Add(-1)
		return err
	}
	return nil
}

// charge counts objects and bytes more for session s (under its shard's
// lock), or says which limit refuses them and counts nothing.
func (e *Engine) charge(s *session, objects, bytes int64) *LimitError {
	l := e.pool.Limits()
	refuse := func(limit string, have, need, max int64) *LimitError {
		return &LimitError{Limit: limit, Namespace: namespaceOf(s.wf), Session: s.id, Have: have, Need: need, Max: max}
	}
	if max := l.ObjectsPerSession; max > 0 && objects > 0 && s.objects+objects > max {
		return refuse(LimitObjectsPerSession, s.objects, objects, max)
	}
	if max := l.BytesPerSession; max > 0 && bytes > 0 && s.bytes+bytes > max {
		return refuse(LimitBytesPerSession, s.bytes, bytes, max)
	}
	if have, ok := take(&s.ns.objects, objects, l.ObjectsPerNamespace); !ok {
		return refuse(LimitObjectsPerNamespace, have, objects, l.ObjectsPerNamespace)
	}
	if have, ok := take(&s.ns.bytes, bytes, l.BytesPerNamespace); !ok {
		s.ns.objects.Add(-objects)
		return refuse(LimitBytesPerNamespace, have, bytes, l.BytesPerNamespace)
	}
	s.objects += objects
	s.bytes += bytes
	return nil
}

// owe notes an entry the session keeps that settle charges at the end of
// the event (an invocation or a duplicate key remembered on the way).
func (s *session) owe(objects, bytes int64) {
	s.debtObjects += objects
	s.debtBytes += bytes
}

// settle charges what the session owes; a refusal fails it.
func (e *Engine) settle(sh *shard, s *session, now time.Time, out []Action) []Action {
	if s.debtObjects == 0 && s.debtBytes == 0 {
		return out
	}
	objects, bytes := s.debtObjects, s.debtBytes
	s.debtObjects, s.debtBytes = 0, 0
	if sh.sessions[s.id] != s {
		return out // it ended during the event: nothing is held any more
	}
	if err := e.charge(s, objects, bytes); err != nil {
		return e.failLimit(sh, s, err, now)
	}
	return out
}

// release gives back what an ended session held. The session counts on
// in an account of its own (if anything more reaches it).
func (e *Engine) release(s *session) {
	if s.ns == nil || s.ns.detached {
		return
	}
	s.ns.sessions.Add(-1)
	s.ns.objects.Add(-s.objects)
	s.ns.bytes.Add(-s.bytes)
	s.ns = &usage{detached: true}
}

// Release gives back to the pool what every running session holds,
// leaving the sessions in place (for a last Snapshot): the engine stops
// serving (an operator replica gave its bucket up; the next owner's
// engine counts them when it restores them).
func (e *Engine) Release() {
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.Lock()
		for _, s := range sh.sessions {
			e.release(s)
		}
		sh.mu.Unlock()
	}
}

// failLimit ends a session a limit refused, dropping the actions its event
// decided: nothing it would have fired runs.
func (e *Engine) failLimit(sh *shard, s *session, err *LimitError, now time.Time) []Action {
	out := e.fail(sh, s, err.Error(), now)
	out[0].Limit = err.Limit
	return out
}

// objectBytes is what an object costs the engine, in bytes.
func objectBytes(o *Object) int64 {
	n := len(o.Bucket) + len(o.Key) + len(o.Ref) + len(o.Inline) + len(o.Producer) + len(o.Invocation)
	for k, v := range o.Metadata {
		n += len(k) + len(v)
	}
	return int64(n)
}
