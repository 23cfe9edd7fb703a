package engine

import (
	"fmt"
	"hash/maphash"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Engine evaluates triggers for many workflows and sessions. All methods are
// safe for concurrent use; events for different sessions proceed in parallel.
type Engine struct {
	workflows atomic.Pointer[map[string]*workflow] // copy-on-write
	wfMu      sync.Mutex                           // serializes writers of workflows
	shards    []shard
	seed      maphash.Seed
	// TombstoneTTL is how long an ended session is remembered so that late
	// events for it fire nothing.
	TombstoneTTL time.Duration
}

type shard struct {
	mu       sync.Mutex
	sessions map[string]*session
	ended    map[string]time.Time // tombstones: session -> forget after
}

// workflow is a compiled WorkflowSpec.
type workflow struct {
	spec     WorkflowSpec
	triggers []*trigger
	byBucket map[string][]*trigger
}

type trigger struct {
	spec TriggerSpec
	prim Primitive
}

// session is one running session's state.
type session struct {
	id, wf      string
	started     time.Time
	deadline    time.Time
	seq         int                  // invocation counter
	states      map[string]*State    // per trigger
	seen        map[string]bool      // bucket/key accepted
	invocations map[string]*invState // base invocation id -> state
}

type invState struct {
	Function string `json:"function"`
	Finished bool   `json:"finished"`
	Failed   bool   `json:"failed,omitempty"`
}

// New returns an engine with the given number of shards (0: 64).
func New(shards int) *Engine {
	if shards <= 0 {
		shards = 64
	}
	e := &Engine{shards: make([]shard, shards), seed: maphash.MakeSeed(), TombstoneTTL: time.Hour}
	for i := range e.shards {
		e.shards[i] = shard{sessions: map[string]*session{}, ended: map[string]time.Time{}}
	}
	empty := map[string]*workflow{}
	e.workflows.Store(&empty)
	return e
}

// SetWorkflow adds or replaces a workflow. Running sessions keep their
// per-trigger state; triggers that disappeared stop firing.
func (e *Engine) SetWorkflow(spec WorkflowSpec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	wf := &workflow{spec: spec, byBucket: map[string][]*trigger{}}
	for _, ts := range spec.Triggers {
		p, err := newPrimitive(ts)
		if err != nil {
			return err
		}
		t := &trigger{spec: ts, prim: p}
		wf.triggers = append(wf.triggers, t)
		wf.byBucket[ts.Bucket] = append(wf.byBucket[ts.Bucket], t)
	}
	e.wfMu.Lock()
	defer e.wfMu.Unlock()
	next := map[string]*workflow{}
	for k, v := range *e.workflows.Load() {
		next[k] = v
	}
	next[spec.Name] = wf
	e.workflows.Store(&next)
	return nil
}

// RegisterPrimitive makes a custom primitive available to SetWorkflow.
// Call it at start-up, before any SetWorkflow.
func RegisterPrimitive(kind Kind, f Factory) { builtins[kind] = f }

// RemoveWorkflow forgets a workflow; its sessions expire at their deadlines.
func (e *Engine) RemoveWorkflow(name string) {
	e.wfMu.Lock()
	defer e.wfMu.Unlock()
	next := map[string]*workflow{}
	for k, v := range *e.workflows.Load() {
		if k != name {
			next[k] = v
		}
	}
	e.workflows.Store(&next)
}

func (e *Engine) workflow(name string) *workflow { return (*e.workflows.Load())[name] }

func (e *Engine) shard(session string) *shard {
	return &e.shards[maphash.String(e.seed, session)%uint64(len(e.shards))]
}

// StartSession begins a session of a workflow and invokes its entry
// function with the input (as an object of the pseudo-bucket "input").
func (e *Engine) StartSession(wfName, id string, input Object, now time.Time) ([]Action, error) {
	wf := e.workflow(wfName)
	if wf == nil {
		return nil, fmt.Errorf("unknown workflow %q", wfName)
	}
	sh := e.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.sessions[id]; ok {
		return nil, fmt.Errorf("session %s already running", id)
	}
	if _, ok := sh.ended[id]; ok {
		return nil, fmt.Errorf("session %s already ended", id)
	}
	s := &session{id: id, wf: wfName, started: now, deadline: now.Add(wf.spec.SessionDeadline),
		states: map[string]*State{}, seen: map[string]bool{}, invocations: map[string]*invState{}}
	sh.sessions[id] = s
	input.Session = id
	if input.Bucket == "" {
		input.Bucket = "input"
	}
	if input.Key == "" {
		input.Key = "input"
	}
	return []Action{s.invoke(wf, wf.spec.Entry, "", []Object{input}, "")}, nil
}

// invoke records a dispatched invocation and returns its action.
func (s *session) invoke(wf *workflow, fn, trig string, objs []Object, group string) Action {
	id := s.id + "." + strconv.Itoa(s.seq)
	s.seq++
	s.invocations[id] = &invState{Function: fn}
	return Action{Kind: ActInvoke, Workflow: wf.spec.Name, Session: s.id, Function: fn, Trigger: trig, Invocation: id, Objects: objs, Group: group}
}

// ObjectReady handles an object put into a bucket.
func (e *Engine) ObjectReady(wfName string, obj Object, now time.Time) []Action {
	wf := e.workflow(wfName)
	if wf == nil {
		return nil
	}
	sh := e.shard(obj.Session)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.sessions[obj.Session]
	if s == nil {
		return nil // unknown or ended (tombstoned) session: nothing fires after GC
	}
	dedup := obj.Bucket + "/" + obj.Key
	if s.seen[dedup] {
		return nil // a resend, or a late duplicate from a re-execution
	}
	s.seen[dedup] = true
	var out []Action
	for _, t := range wf.byBucket[obj.Bucket] {
		for _, f := range t.prim.ActionForNewObject(s.state(t), s, &obj, now) {
			out = append(out, s.fire(wf, t, f)...)
		}
	}
	if obj.Bucket == wf.spec.OutputBucket {
		res := obj
		out = append(out, Action{Kind: ActSessionComplete, Workflow: wf.spec.Name, Session: s.id, Result: &res})
		out = append(out, e.end(sh, s, now)...)
	}
	return out
}

func (s *session) fire(wf *workflow, t *trigger, f Firing) []Action {
	out := make([]Action, 0, len(t.spec.Targets))
	for _, target := range t.spec.Targets {
		out = append(out, s.invoke(wf, target, t.spec.Name, f.Objects, f.Group))
	}
	return out
}

func (s *session) state(t *trigger) *State {
	st := s.states[t.spec.Name]
	if st == nil {
		st = &State{}
		s.states[t.spec.Name] = st
	}
	return st
}

// end garbage-collects a session and leaves a tombstone.
func (e *Engine) end(sh *shard, s *session, now time.Time) []Action {
	delete(sh.sessions, s.id)
	sh.ended[s.id] = now.Add(e.TombstoneTTL)
	return []Action{{Kind: ActDropObjects, Workflow: s.wf, Session: s.id}}
}

// FunctionStarted tells the session's triggers that a function began, with
// the arguments a re-execution would need.
func (e *Engine) FunctionStarted(wfName, sessionID, fn, invocation string, args []byte, now time.Time) []Action {
	return e.sourceEvent(wfName, sessionID, SourceEvent{Function: fn, Invocation: baseInvocation(invocation), Args: args}, invocation, false, now)
}

// FunctionFinished tells the session's triggers that a function ended.
func (e *Engine) FunctionFinished(wfName, sessionID, fn, invocation string, failed bool, now time.Time) []Action {
	return e.sourceEvent(wfName, sessionID, SourceEvent{Function: fn, Invocation: baseInvocation(invocation), Finished: true}, invocation, failed, now)
}

func (e *Engine) sourceEvent(wfName, sessionID string, ev SourceEvent, rawID string, failed bool, now time.Time) []Action {
	wf := e.workflow(wfName)
	if wf == nil {
		return nil
	}
	sh := e.shard(sessionID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.sessions[sessionID]
	if s == nil {
		return nil
	}
	inv := s.invocations[ev.Invocation]
	if inv == nil {
		inv = &invState{Function: ev.Function}
		s.invocations[ev.Invocation] = inv
	}
	if ev.Finished {
		if inv.Finished && !inv.Failed {
			return nil // duplicate
		}
		inv.Finished, inv.Failed = true, failed
	} else if rawID != ev.Invocation {
		// A re-execution starting: its original is outstanding again.
		inv.Finished, inv.Failed = false, false
	}
	var out []Action
	for _, t := range wf.triggers {
		for _, f := range t.prim.NotifySourceFunc(s.state(t), s, ev, now) {
			out = append(out, s.fire(wf, t, f)...)
		}
	}
	return out
}

// Tick advances time: ByTime windows close, late sources are re-executed,
// sessions past their deadline expire.
func (e *Engine) Tick(now time.Time) []Action {
	var out []Action
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.Lock()
		for id, s := range sh.sessions {
			if !now.Before(s.deadline) {
				out = append(out, Action{Kind: ActSessionExpired, Workflow: s.wf, Session: id})
				out = append(out, e.end(sh, s, now)...)
				continue
			}
			wf := e.workflow(s.wf)
			if wf == nil {
				// Not loaded yet (an operator restoring a checkpoint while its
				// reconcilers load workflows) or removed: the session waits
				// for its workflow until its deadline.
				continue
			}
			for _, t := range wf.triggers {
				st := s.states[t.spec.Name]
				if st == nil {
					continue
				}
				if d := t.prim.NextDeadline(st); d.IsZero() || now.Before(d) {
					continue
				}
				for _, f := range t.prim.ActionForNewObject(st, s, nil, now) {
					out = append(out, s.fire(wf, t, f)...)
				}
				for _, r := range t.prim.ActionForRerun(st, now) {
					out = append(out, Action{Kind: ActRerun, Workflow: s.wf, Session: id, Function: r.Function, Trigger: t.spec.Name,
						Invocation: r.Invocation + ".r" + strconv.Itoa(r.Attempt), Args: r.Args, Attempt: r.Attempt})
				}
			}
		}
		for id, until := range sh.ended {
			if !now.Before(until) {
				delete(sh.ended, id)
			}
		}
		sh.mu.Unlock()
	}
	sortActions(out)
	return out
}

// NextDeadline is the earliest time Tick has work (zero: none).
func (e *Engine) NextDeadline() time.Time {
	var next time.Time
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.Lock()
		for _, s := range sh.sessions {
			next = earliest(next, s.deadline)
			if wf := e.workflow(s.wf); wf != nil {
				for _, t := range wf.triggers {
					if st := s.states[t.spec.Name]; st != nil {
						next = earliest(next, t.prim.NextDeadline(st))
					}
				}
			}
		}
		sh.mu.Unlock()
	}
	return next
}

// Sessions counts running sessions.
func (e *Engine) Sessions() int {
	n := 0
	for i := range e.shards {
		e.shards[i].mu.Lock()
		n += len(e.shards[i].sessions)
		e.shards[i].mu.Unlock()
	}
	return n
}

// Outstanding implements SessionView.
func (s *session) Outstanding(fn string) int {
	n := 0
	for _, inv := range s.invocations {
		if inv.Function == fn && (!inv.Finished || (inv.Failed && s.rerunPending(fn))) {
			n++
		}
	}
	return n
}

// rerunPending reports whether any trigger still plans to re-execute fn.
func (s *session) rerunPending(fn string) bool {
	for _, st := range s.states {
		for _, p := range st.Pending {
			if p.Function == fn {
				return true
			}
		}
	}
	return false
}

// Invocations implements SessionView.
func (s *session) Invocations(fn string) int {
	n := 0
	for _, inv := range s.invocations {
		if inv.Function == fn {
			n++
		}
	}
	return n
}

// baseInvocation strips a re-execution suffix: "s.3.r2" -> "s.3".
func baseInvocation(id string) string {
	if i := strings.LastIndex(id, ".r"); i > 0 {
		if _, err := strconv.Atoi(id[i+2:]); err == nil {
			return id[:i]
		}
	}
	return id
}

// sortActions orders Tick's output deterministically (maps are unordered).
func sortActions(a []Action) {
	sort.SliceStable(a, func(i, j int) bool {
		if a[i].Session != a[j].Session {
			return a[i].Session < a[j].Session
		}
		return a[i].Invocation < a[j].Invocation
	})
}
