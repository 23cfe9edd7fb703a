package engine

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"
)

// State is a trigger's state in one session. Built-in primitives use the
// typed fields; a custom primitive may keep any JSON in Custom. All of it is
// part of the engine's Snapshot.
type State struct {
	Objects       []Object            `json:"objects,omitempty"`       // accumulated, not yet fired
	Keys          map[string]bool     `json:"keys,omitempty"`          // distinct keys counted so far
	Fired         bool                `json:"fired,omitempty"`         // once-per-session primitives
	WindowEnd     time.Time           `json:"windowEnd,omitzero"`      // ByTime: close of the open window
	Expected      map[string]bool     `json:"expected,omitempty"`      // DynamicJoin: declared keys
	ExpectedCount int                 `json:"expectedCount,omitempty"` // DynamicJoin: declared count
	Groups        map[string][]Object `json:"groups,omitempty"`        // DynamicGroup
	Declarers     map[string]bool     `json:"declarers,omitempty"`     // DynamicJoin without sources: functions that declared
	Pending       map[string]*Pending `json:"pending,omitempty"`       // re-execution, by source invocation
	Waves         map[int]*Wave       `json:"waves,omitempty"`         // speculation: each speculating rule's current wave, by rule index
	Custom        json.RawMessage     `json:"custom,omitempty"`
}

// Pending is a source invocation whose output the trigger still waits for.
type Pending struct {
	Function string    `json:"function"`
	Args     []byte    `json:"args,omitempty"`
	Deadline time.Time `json:"deadline"`
	Attempts int       `json:"attempts"` // re-executions so far
	Rule     int       `json:"rule"`     // index into the trigger's rules
	// Speculation (RerunRule.SpeculateAfter): Wave marks a member of the
	// rule's current wave, Copied one that got its speculative copy,
	// Speculate one whose copy is due now.
	Wave      bool `json:"wave,omitempty"`
	Copied    bool `json:"copied,omitempty"`
	Speculate bool `json:"speculate,omitempty"`
}

// Wave counts one speculating rule's current wave of source invocations
// (see RerunRule): how many joined it, how many of them sent their output,
// and how many are still outstanding (neither sent nor given up). It is
// closed when none is outstanding; the next start opens a new one, unless
// the same upstream invocation fed it: Upstream holds the invocations
// (base ids, at most maxWaveUpstream) whose outputs fired its members, and
// a splitter still sending chunks while its first mappers already finished
// (a loaded machine) keeps one wave, not one wave per gap.
type Wave struct {
	Members  int      `json:"members"`
	Finished int      `json:"finished"`
	Open     int      `json:"open"`
	Upstream []string `json:"upstream,omitempty"`
}

// maxWaveUpstream bounds Wave.Upstream: a wave fed one-to-one by many
// upstream invocations (a pipelined stage) remembers its first ones only,
// and past them a gap with nothing outstanding still opens a new wave.
const maxWaveUpstream = 16

// continues reports whether a member fed by upstream joins this wave
// rather than opening a new one.
func (w *Wave) continues(upstream []string) bool {
	if w.Open > 0 {
		return true
	}
	for _, u := range upstream {
		if slices.Contains(w.Upstream, u) {
			return true
		}
	}
	return false
}

// join counts a new member fed by upstream.
func (w *Wave) join(upstream []string) {
	w.Members++
	w.Open++
	for _, u := range upstream {
		if len(w.Upstream) < maxWaveUpstream && !slices.Contains(w.Upstream, u) {
			w.Upstream = append(w.Upstream, u)
		}
	}
}

// Firing is a decision to invoke the trigger's targets with Objects.
type Firing struct {
	Objects []Object
	Group   string
}

// Rerun is a decision to re-invoke a source invocation.
type Rerun struct {
	Function   string
	Invocation string // the original invocation id
	Args       []byte
	Attempt    int
	// Speculative: a copy of a straggler whose wave mostly finished, not
	// a re-execution of a late one.
	Speculative bool
}

// SourceEvent tells a trigger that a function of its session started or finished.
type SourceEvent struct {
	Function   string
	Invocation string // base id (re-executions share their original's id)
	Args       []byte
	Finished   bool
	// Repeat marks a start of an invocation that started before: a resent
	// event, or a re-execution of it.
	Repeat bool
	// Upstream are the invocations (base ids) whose outputs the engine
	// fired this one with; empty when it did not fire it (an entry, or an
	// invocation it learns of only from its start).
	Upstream []string
}

// SessionView is what a primitive may ask about the rest of its session.
type SessionView interface {
	// Outstanding counts invocations of fn dispatched or started in this
	// session that have not finished.
	Outstanding(fn string) int
	// Invocations counts invocations of fn seen in this session.
	Invocations(fn string) int
	// Quiescent reports whether no invocation of the session may still
	// produce output: every one has finished (or failed with no
	// re-execution pending) and every output it sent has been counted.
	// Only then can nothing dispatch more work (e.g. a late mapper).
	Quiescent() bool
}

// Primitive is the Pheromone trigger interface (Fig. 5). The engine calls
// it with the trigger's per-session State, under the session's lock.
type Primitive interface {
	// ActionForNewObject is called for each new object of the trigger's
	// bucket, and with obj == nil when the clock reaches NextDeadline.
	ActionForNewObject(st *State, s SessionView, obj *Object, now time.Time) []Firing
	// NotifySourceFunc is called when any function of the session starts or finishes.
	NotifySourceFunc(st *State, s SessionView, ev SourceEvent, now time.Time) []Firing
	// ActionForRerun returns the source invocations to re-execute at now.
	ActionForRerun(st *State, now time.Time) []Rerun
	// NextDeadline is when the primitive next needs a call with a nil
	// object or to ActionForRerun (zero: never).
	NextDeadline(st *State) time.Time
}

// Factory builds a custom primitive from its trigger spec.
type Factory func(spec TriggerSpec) (Primitive, error)

// builtins maps primitive kinds to their constructors.
var builtins = map[Kind]Factory{
	Immediate:    newImmediate,
	ByName:       newByName,
	BySet:        newBySet,
	ByBatchSize:  newByBatchSize,
	ByTime:       newByTime,
	Redundant:    newRedundant,
	DynamicJoin:  newDynamicJoin,
	DynamicGroup: newDynamicGroup,
}

func newPrimitive(spec TriggerSpec) (Primitive, error) {
	f, ok := builtins[spec.Primitive]
	if !ok {
		return nil, fmt.Errorf("unknown primitive %q", spec.Primitive)
	}
	if len(spec.Targets) == 0 {
		return nil, fmt.Errorf("no targets")
	}
	return f(spec)
}

// reruns is the re-execution bookkeeping every built-in shares: it tracks
// started source invocations named by the trigger's rules and reports the
// ones whose output is late (Pheromone §4.4).
type reruns struct{ rules []RerunRule }

// notify records a started source invocation; output or finish clear it.
func (r reruns) notify(st *State, ev SourceEvent, now time.Time) {
	if ev.Finished || ev.Repeat {
		// Finishing without output is exactly what the timeout catches; a
		// repeated start (resent, or a re-execution) must not re-arm a
		// timeout its output already cleared or its rule gave up.
		return
	}
	for i, rule := range r.rules {
		if rule.SourceFunction != ev.Function {
			continue
		}
		if st.Pending == nil {
			st.Pending = map[string]*Pending{}
		}
		if _, ok := st.Pending[ev.Invocation]; !ok {
			p := &Pending{Function: ev.Function, Args: ev.Args, Deadline: now.Add(rule.Timeout), Rule: i}
			st.Pending[ev.Invocation] = p
			if rule.SpeculateAfter > 0 {
				if st.Waves == nil {
					st.Waves = map[int]*Wave{}
				}
				w := st.Waves[i]
				if w == nil || !w.continues(ev.Upstream) {
					w = &Wave{} // the previous wave, if any, is over
					st.Waves[i] = w
				}
				w.join(ev.Upstream)
				p.Wave = true
			}
		}
	}
}

// left takes a member out of its rule's wave: its output arrived (sent) or
// the rule gave up on it.
func (r reruns) left(st *State, p *Pending, sent bool) {
	if !p.Wave {
		return
	}
	p.Wave = false
	w := st.Waves[p.Rule]
	if w == nil {
		return
	}
	w.Open--
	if sent {
		w.Finished++
	}
}

// speculate marks, once a fraction SpeculateAfter of a wave's members have
// sent their output, every outstanding member that has not had its copy
// and has attempts left as due now (due issues the copies).
func (r reruns) speculate(st *State, now time.Time) {
	for i, w := range st.Waves {
		if i >= len(r.rules) {
			continue // the workflow changed under a running session
		}
		x := r.rules[i].SpeculateAfter
		if w.Open == 0 || float64(w.Finished) < x*float64(w.Members)-1e-9 {
			continue
		}
		for _, p := range st.Pending {
			if p.Rule == i && p.Wave && !p.Copied && !p.Speculate && p.Attempts < r.rules[i].MaxAttempts {
				p.Speculate = true
				p.Deadline = now
			}
		}
	}
}

// arrived clears what an object's arrival satisfies, and marks the copies
// of stragglers that it makes due.
func (r reruns) arrived(st *State, obj *Object, now time.Time) {
	if obj == nil || len(st.Pending) == 0 {
		return
	}
	inv := BaseInvocation(obj.Invocation)
	waves := false
	for id, p := range st.Pending {
		switch r.rules[p.Rule].Scope {
		case PerSession:
			if p.Function == obj.Producer {
				delete(st.Pending, id)
			}
		default: // PerObject
			if id == inv {
				waves = waves || p.Wave
				r.left(st, p, true)
				delete(st.Pending, id)
			}
		}
	}
	if waves {
		r.speculate(st, now)
	}
}

func (r reruns) due(st *State, now time.Time) []Rerun {
	var out []Rerun
	for id, p := range st.Pending {
		if now.Before(p.Deadline) {
			continue
		}
		rule := r.rules[p.Rule]
		if p.Attempts >= rule.MaxAttempts {
			r.left(st, p, false)
			delete(st.Pending, id) // given up: the session deadline decides its fate
			continue
		}
		p.Attempts++
		p.Deadline = now.Add(rule.Timeout)
		spec := p.Speculate
		if spec {
			p.Speculate, p.Copied = false, true
		}
		out = append(out, Rerun{Function: p.Function, Invocation: id, Args: p.Args, Attempt: p.Attempts, Speculative: spec})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Invocation < out[j].Invocation })
	return out
}

func (r reruns) next(st *State) time.Time {
	var next time.Time
	for _, p := range st.Pending {
		if next.IsZero() || p.Deadline.Before(next) {
			next = p.Deadline
		}
	}
	return next
}

// earliest returns the earlier non-zero time.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
