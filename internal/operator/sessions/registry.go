// Package sessions tracks workflow sessions for the gateway: their state,
// a bounded progress log, and their result, with waiters that block until a
// session ends. The trigger engine's adapter writes; the gateway reads.
package sessions

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// State of a session.
type State string

const (
	Running   State = "Running"
	Completed State = "Completed"
	Failed    State = "Failed"
	Expired   State = "Expired"
)

// Ended reports whether the state is final.
func (s State) Ended() bool { return s != Running }

// Event is one line of a session's progress.
type Event struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"` // Invoked, ObjectReady, Rerun, Completed, Failed, Expired
	Message string    `json:"message"`
}

// Result is a completed session's output object.
type Result struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	Inline []byte `json:"-"`
	Ref    string `json:"-"`
}

// Session is a snapshot of one session.
type Session struct {
	ID          string     `json:"id"`
	Namespace   string     `json:"namespace"`
	Workflow    string     `json:"workflow"`
	State       State      `json:"state"`
	Started     time.Time  `json:"started"`
	Ended       *time.Time `json:"ended,omitempty"`
	Invocations int        `json:"invocations"`
	Objects     int        `json:"objects"`
	Error       string     `json:"error,omitempty"`
	Result      *Result    `json:"result,omitempty"`
	Events      []Event    `json:"events,omitempty"`
	// FirstEvent is the sequence number of Events[0]; older events were
	// dropped to keep the log bounded.
	FirstEvent int `json:"firstEvent,omitempty"`
}

// ErrNotFound means no such session is known (never started, or forgotten
// after its retention).
var ErrNotFound = errors.New("session not found")

// Registry holds sessions. It is safe for concurrent use.
type Registry struct {
	// MaxEvents bounds each session's progress log; older events are dropped.
	MaxEvents int
	// Retention is how long ended sessions stay queryable.
	Retention time.Duration
	Now       func() time.Time
	// Checkpointed keeps, for TakeEnded, the sessions that ended or
	// changed after ending and the ids Prune forgot (checkpoint.go).
	Checkpointed bool

	mu       sync.Mutex
	sessions map[string]*entry
	running  map[string]*entry   // the sessions not ended (Running)
	version  uint64              // see Version
	dirty    map[string]struct{} // ended sessions changed since TakeEnded
	gone     []string            // forgotten since TakeEnded
}

type entry struct {
	s       Session
	changed chan struct{} // closed and replaced on every change
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{MaxEvents: 256, Retention: time.Hour, Now: time.Now, sessions: map[string]*entry{}, running: map[string]*entry{}}
}

// Start records a new running session.
func (r *Registry) Start(id, namespace, workflow string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.sessions[id]; ok {
		return fmt.Errorf("session %s already exists", id)
	}
	now := r.Now()
	e := &entry{
		s:       Session{ID: id, Namespace: namespace, Workflow: workflow, State: Running, Started: now, Events: []Event{{Time: now, Kind: "Started", Message: "session started"}}},
		changed: make(chan struct{}),
	}
	r.sessions[id] = e
	r.running[id] = e
	r.version++
	return nil
}

// Forget removes a running session that never ran (its start was refused
// after it was recorded); an ended or unknown one is left alone.
func (r *Registry) Forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.running[id]
	if !ok {
		return
	}
	delete(r.running, id)
	delete(r.sessions, id)
	close(e.changed)
	r.version++
}

// Update applies fn to a session and wakes its waiters.
func (r *Registry) Update(id string, fn func(*Session)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sessions[id]
	if !ok {
		return ErrNotFound
	}
	wasEnded := e.s.State.Ended()
	fn(&e.s)
	if !wasEnded && e.s.State.Ended() && e.s.Ended == nil {
		t := r.Now()
		e.s.Ended = &t
	}
	if over := len(e.s.Events) - r.MaxEvents; over > 0 {
		e.s.Events = append([]Event(nil), e.s.Events[over:]...)
		e.s.FirstEvent += over
	}
	close(e.changed)
	e.changed = make(chan struct{})
	r.version++
	if e.s.State.Ended() {
		delete(r.running, id)
	}
	if r.Checkpointed && e.s.State.Ended() {
		if r.dirty == nil {
			r.dirty = map[string]struct{}{}
		}
		r.dirty[id] = struct{}{}
	}
	return nil
}

// Log appends a progress event.
func (r *Registry) Log(id, kind, format string, args ...any) {
	_ = r.Update(id, func(s *Session) {
		s.Events = append(s.Events, Event{Time: r.Now(), Kind: kind, Message: fmt.Sprintf(format, args...)})
	})
}

// Finish ends a session with a state, result and optional error.
func (r *Registry) Finish(id string, state State, result *Result, errMsg string) error {
	return r.Update(id, func(s *Session) {
		if s.State.Ended() {
			return // the first ending wins (e.g. a late result after expiry)
		}
		s.State, s.Result, s.Error = state, result, errMsg
		msg := string(state)
		if errMsg != "" {
			msg += ": " + errMsg
		}
		s.Events = append(s.Events, Event{Time: r.Now(), Kind: string(state), Message: msg})
	})
}

// Get returns a copy of a session.
func (r *Registry) Get(id string) (Session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sessions[id]
	if !ok {
		return Session{}, ErrNotFound
	}
	return clone(e.s), nil
}

// Wait blocks until the session has ended or ctx is done, and returns it.
func (r *Registry) Wait(ctx context.Context, id string) (Session, error) {
	for {
		r.mu.Lock()
		e, ok := r.sessions[id]
		if !ok {
			r.mu.Unlock()
			return Session{}, ErrNotFound
		}
		s, ch := clone(e.s), e.changed
		r.mu.Unlock()
		if s.State.Ended() {
			return s, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return s, ctx.Err()
		}
	}
}

// Watch returns the session now and a channel closed at its next change.
func (r *Registry) Watch(id string) (Session, <-chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sessions[id]
	if !ok {
		return Session{}, nil, ErrNotFound
	}
	return clone(e.s), e.changed, nil
}

// List returns the sessions of a namespace (all namespaces when empty),
// newest first (SortNewestFirst).
func (r *Registry) List(namespace, workflow string) []Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Session
	for _, e := range r.sessions {
		if (namespace == "" || e.s.Namespace == namespace) && (workflow == "" || e.s.Workflow == workflow) {
			s := clone(e.s)
			s.Events = nil
			out = append(out, s)
		}
	}
	SortNewestFirst(out)
	return out
}

// Counts returns, per workflow of a namespace, how many sessions are in each state.
func (r *Registry) Counts(namespace, workflow string) map[State]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := map[State]int64{}
	for _, e := range r.sessions {
		if e.s.Namespace == namespace && e.s.Workflow == workflow {
			c[e.s.State]++
		}
	}
	return c
}

// LastFailed returns the workflow's most recently failed session (its
// Error says why), or false when none failed within Retention.
func (r *Registry) LastFailed(namespace, workflow string) (Session, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last *Session
	for _, e := range r.sessions {
		s := &e.s
		if s.Namespace != namespace || s.Workflow != workflow || s.State != Failed || s.Ended == nil {
			continue
		}
		if last == nil || s.Ended.After(*last.Ended) || (s.Ended.Equal(*last.Ended) && s.ID > last.ID) {
			last = s
		}
	}
	if last == nil {
		return Session{}, false
	}
	s := clone(*last)
	s.Events = nil
	return s, true
}

// Prune forgets sessions that ended longer than Retention ago.
func (r *Registry) Prune() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	cutoff := r.Now().Add(-r.Retention)
	n := 0
	for id, e := range r.sessions {
		if e.s.Ended != nil && e.s.Ended.Before(cutoff) {
			delete(r.sessions, id)
			delete(r.dirty, id)
			if r.Checkpointed {
				r.gone = append(r.gone, id)
			}
			n++
		}
	}
	if n > 0 {
		r.version++
	}
	return n
}

func clone(s Session) Session {
	s.Events = append([]Event(nil), s.Events...)
	if s.Result != nil {
		res := *s.Result
		s.Result = &res
	}
	return s
}

// Export returns every session, for checkpoints.
func (r *Registry) Export() []Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Session, 0, len(r.sessions))
	for _, e := range r.sessions {
		out = append(out, clone(e.s))
	}
	return out
}

// Import replaces the registry's sessions with a checkpoint's.
func (r *Registry) Import(list []Session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.sessions {
		close(e.changed)
	}
	r.sessions, r.running = map[string]*entry{}, map[string]*entry{}
	r.version++
	clear(r.dirty)
	r.gone = nil
	for _, s := range list {
		e := &entry{s: clone(s), changed: make(chan struct{})}
		r.sessions[s.ID] = e
		if !s.State.Ended() {
			r.running[s.ID] = e
		}
	}
}
