package engine

import (
	"fmt"
	"hash/maphash"
	"slices"
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
	pool         *Pool // what sessions hold, per namespace (limits.go)
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
	rerun    map[string]bool // functions some re-execution rule covers
}

type trigger struct {
	spec TriggerSpec
	prim Primitive
}

// New returns an engine with the given number of shards (0: 64).
func New(shards int) *Engine {
	if shards <= 0 {
		shards = 64
	}
	e := &Engine{shards: make([]shard, shards), seed: maphash.MakeSeed(), TombstoneTTL: time.Hour, pool: NewPool(Limits{})}
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
	wf := &workflow{spec: spec, byBucket: map[string][]*trigger{}, rerun: map[string]bool{}}
	for _, ts := range spec.Triggers {
		p, err := newPrimitive(ts)
		if err != nil {
			return err
		}
		t := &trigger{spec: ts, prim: p}
		wf.triggers = append(wf.triggers, t)
		wf.byBucket[ts.Bucket] = append(wf.byBucket[ts.Bucket], t)
		for _, r := range ts.Reruns {
			wf.rerun[r.SourceFunction] = true
		}
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
// function with the input (as an object of the pseudo-bucket "input"). A
// start the engine's limits refuse fails with a *LimitError.
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
		states: map[string]*State{}, seen: map[string]string{}, invocations: map[string]*invState{}}
	input.Session = id
	if input.Bucket == "" {
		input.Bucket = "input"
	}
	if input.Key == "" {
		input.Key = "input"
	}
	if err := e.admit(s, objectBytes(&input)); err != nil {
		return nil, err
	}
	sh.sessions[id] = s
	return []Action{s.invoke(wf, wf.spec.Entry, "", []Object{input}, "")}, nil
}

// invoke records a dispatched invocation and returns its action.
func (s *session) invoke(wf *workflow, fn, trig string, objs []Object, group string) Action {
	id := s.id + "." + strconv.Itoa(s.seq)
	s.seq++
	s.track(id, &invState{Function: fn, Upstream: upstreamOf(objs)})
	return Action{Kind: ActInvoke, Workflow: wf.spec.Name, Session: s.id, Function: fn, Trigger: trig, Invocation: id, Objects: objs, Group: group}
}

// ObjectReady handles an object put into a bucket.
func (e *Engine) ObjectReady(wfName string, obj Object, now time.Time) []Action {
	return e.ObjectReadyFresh(wfName, obj, now, nil)
}

// ObjectReadyFresh is ObjectReady that sets *fresh (when fresh is not nil)
// if the object is new to its session, not a resend or a duplicate (the
// dispatcher's response and the sidecar's report of one return value).
func (e *Engine) ObjectReadyFresh(wfName string, obj Object, now time.Time, fresh *bool) []Action {
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
	name := obj.Bucket + "/" + obj.Key
	base := BaseInvocation(obj.Invocation)
	if s.invocations[base] == nil && s.orphan(base) {
		return nil
	}
	// Claims of local firings count only from the session's own workflow,
	// for an object some invocation produced (the control server checks
	// that it is the reporting pod's own). The engine may not know that
	// invocation yet: a delegated one's outputs can arrive before the
	// claim that made it.
	var claims []string
	if wf.spec.Delegate && s.wf == wfName && base != "" {
		claims = obj.FiredLocally
	}
	obj.FiredLocally = nil
	first, dup := s.seen[name]
	// A delegated invocation's outputs, reported by its own sidecar, may
	// arrive before the claim that made it: counted all the same.
	var early string
	if wf.spec.Delegate && strings.HasPrefix(base, s.id+".d") {
		early = obj.Producer
	}
	if !dup {
		// A new object is counted before anything keeps it (limits.go).
		if err := e.charge(s, 1, objectBytes(&obj)); err != nil {
			return e.failLimit(sh, s, err, now)
		}
		if fresh != nil {
			*fresh = true
		}
	}
	done := s.count(base, name, dup, first, early)
	var out []Action
	if !dup { // else a resend, or a late duplicate from a re-execution
		s.seen[name] = base
		for _, t := range wf.byBucket[obj.Bucket] {
			st := s.state(t)
			for _, f := range t.prim.ActionForNewObject(st, s, &obj, now) {
				if wf.spec.Delegate && Delegable(t.spec) {
					out = s.fireDelegated(out, wf, t, &obj, claims)
					continue
				}
				out = append(out, s.fire(wf, t, f)...)
			}
			// An arrival may make re-executions due at once: the
			// speculative copies of a wave's stragglers (none once the
			// session's output arrived: it ends here).
			if d := t.prim.NextDeadline(st); !d.IsZero() && !now.Before(d) && obj.Bucket != wf.spec.OutputBucket {
				out = append(out, s.rerun(t, st, now)...)
			}
		}
		if obj.Bucket == wf.spec.OutputBucket {
			res := obj
			out = append(out, Action{Kind: ActSessionComplete, Workflow: wf.spec.Name, Session: s.id, Result: &res, Invocations: len(s.invocations)})
			return append(out, e.end(sh, s, now)...)
		}
	}
	if done != nil {
		// The last output of a finished invocation: to the triggers, it
		// has finished only now.
		out = append(out, s.notify(wf, SourceEvent{Function: done.Function, Invocation: base, Finished: true}, now)...)
	}
	return e.settle(sh, s, now, out)
}

func (s *session) notify(wf *workflow, ev SourceEvent, now time.Time) []Action {
	var out []Action
	for _, t := range wf.triggers {
		for _, f := range t.prim.NotifySourceFunc(s.state(t), s, ev, now) {
			out = append(out, s.fire(wf, t, f)...)
		}
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

// fireDelegated appends a delegable trigger's firing on obj, one action
// per target under its derived id (see delegated).
func (s *session) fireDelegated(out []Action, wf *workflow, t *trigger, obj *Object, claims []string) []Action {
	for _, target := range t.spec.Targets {
		a, ok := s.delegated(wf, t, target, obj, claims)
		if !ok {
			a = s.invoke(wf, target, t.spec.Name, []Object{*obj}, "")
		}
		out = append(out, a)
	}
	return out
}

// end garbage-collects a session and leaves a tombstone.
func (e *Engine) end(sh *shard, s *session, now time.Time) []Action {
	delete(sh.sessions, s.id)
	e.release(s)
	sh.ended[s.id] = now.Add(e.TombstoneTTL)
	return []Action{{Kind: ActDropObjects, Workflow: s.wf, Session: s.id}}
}

// FunctionStarted tells the session's triggers that a function began, with
// the arguments a re-execution would need.
func (e *Engine) FunctionStarted(wfName, sessionID, fn, invocation string, args []byte, now time.Time) []Action {
	return e.sourceEvent(wfName, sessionID, SourceEvent{Function: fn, Invocation: BaseInvocation(invocation), Args: args}, invocation, Finish{}, now)
}

// FunctionFinished tells the session's triggers that a function ended; see
// FunctionEnded.
func (e *Engine) FunctionFinished(wfName, sessionID, fn, invocation string, failed bool, now time.Time) []Action {
	return e.FunctionEnded(wfName, sessionID, fn, invocation, Finish{Failed: failed}, now)
}

// FunctionEnded tells the session's triggers that a function ended. A
// failure that no re-execution rule covers fails the session: it ends here
// (ActSessionFailed, then its objects are dropped) and nothing more runs.
func (e *Engine) FunctionEnded(wfName, sessionID, fn, invocation string, f Finish, now time.Time) []Action {
	return e.sourceEvent(wfName, sessionID, SourceEvent{Function: fn, Invocation: BaseInvocation(invocation), Finished: true}, invocation, f, now)
}

// FailSession ends a running session as failed, for a reason found outside
// the engine (an invocation that could not be dispatched). An ended or
// unknown session is left alone.
func (e *Engine) FailSession(sessionID, reason string, now time.Time) []Action {
	sh := e.shard(sessionID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.sessions[sessionID]
	if s == nil {
		return nil
	}
	return e.fail(sh, s, reason, now)
}

func (e *Engine) fail(sh *shard, s *session, reason string, now time.Time) []Action {
	return append([]Action{{Kind: ActSessionFailed, Workflow: s.wf, Session: s.id, Reason: reason}}, e.end(sh, s, now)...)
}

func (e *Engine) sourceEvent(wfName, sessionID string, ev SourceEvent, rawID string, fin Finish, now time.Time) []Action {
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
	if inv == nil && s.orphan(ev.Invocation) {
		return nil
	}
	if inv == nil {
		// An invocation the engine did not issue (a sidecar's delegated
		// firing, or made up): counted before it is kept (limits.go).
		if err := e.charge(s, 1, int64(len(ev.Invocation)+len(ev.Function)+len(ev.Args))); err != nil {
			return e.failLimit(sh, s, err, now)
		}
		inv = &invState{Function: ev.Function}
		s.track(ev.Invocation, inv)
	}
	if ev.Finished {
		if rawID == ev.Invocation {
			inv.OrigEnded = true
		} else if _, ok := inv.Reruns[rawID]; ok {
			inv.Reruns[rawID] = false
		}
		if fin.Failed && inv.racing(ev.Invocation, rawID) {
			return nil // another execution may still finish it
		}
		if inv.Finished && !inv.Failed {
			return nil // duplicate, or the slower of an invocation and its copy
		}
		// A failure after an execution succeeded (a re-execution reopened
		// the invocation, then failed) leaves the success standing.
		failed := fin.Failed && !inv.Succeeded
		s.change(inv, func() {
			inv.Finished, inv.Failed = true, failed
			inv.Args = nil
			if !fin.Failed {
				inv.Sent = max(inv.Sent, fin.Outputs)
				inv.Succeeded = true
			}
		})
		if failed && !wf.rerun[ev.Function] {
			reason := fmt.Sprintf("function %s failed and no re-execution rule covers it", ev.Function)
			if fin.Error != "" {
				reason += ": " + fin.Error
			}
			return e.fail(sh, s, reason, now)
		}
	} else {
		ev.Upstream = inv.Upstream
		// A resent start, or a re-execution's: nothing new to time.
		ev.Repeat = inv.Started
		inv.Started = true
		if !inv.Finished && len(ev.Args) > 0 && rawID == ev.Invocation && s.engines(rawID, inv) {
			inv.Args = ev.Args
		}
		if live, ok := inv.Reruns[rawID]; ok && !live {
			// A resent start of a re-execution that ended.
		} else if slices.Contains(inv.Copies, rawID) && inv.Finished && !inv.Failed && !s.awaited(ev.Invocation) {
			// A speculative copy starting after its original finished and
			// sent what the triggers waited for: the original won, the
			// copy's outputs are duplicates.
		} else if rawID != ev.Invocation {
			// A re-execution starting: its original is outstanding again.
			s.change(inv, func() { inv.Finished, inv.Failed = false, false })
		}
	}
	return s.notify(wf, ev, now)
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
				out = append(out, s.rerun(t, st, now)...)
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

// rerun returns the re-executions a trigger has due, recorded on their
// invocations (see invState.Reruns).
func (s *session) rerun(t *trigger, st *State, now time.Time) []Action {
	var out []Action
	for _, r := range t.prim.ActionForRerun(st, now) {
		id := r.Invocation + ".r" + strconv.Itoa(r.Attempt)
		if inv := s.invocations[r.Invocation]; inv != nil {
			if inv.Reruns == nil {
				inv.Reruns = map[string]bool{}
			}
			inv.Reruns[id] = true
			if r.Speculative {
				inv.Copies = append(inv.Copies, id)
			}
			// Outstanding again from now, not from the re-execution's
			// start: until it ends, it may send what the rule waits for,
			// even once the rule has given up.
			s.change(inv, func() { inv.Finished, inv.Failed = false, false })
		}
		out = append(out, Action{Kind: ActRerun, Workflow: s.wf, Session: s.id, Function: r.Function, Trigger: t.spec.Name,
			Invocation: id, Args: r.Args, Attempt: r.Attempt, Speculative: r.Speculative})
	}
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

// sortActions orders Tick's output deterministically (maps are unordered).
func sortActions(a []Action) {
	sort.SliceStable(a, func(i, j int) bool {
		if a[i].Session != a[j].Session {
			return a[i].Session < a[j].Session
		}
		return a[i].Invocation < a[j].Invocation
	})
}
