package engine

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// A session's bookkeeping: its invocations, their states and the counters
// primitives ask about.

// session is one running session's state.
type session struct {
	id, wf   string
	started  time.Time
	deadline time.Time
	seq      int               // invocation counter
	states   map[string]*State // per trigger
	// seen holds every accepted bucket/key with the base invocation that
	// sent it first ("" when unknown), and seenKey(inv, name) for a later
	// invocation that sent the same name, so outputs are counted once per
	// invocation.
	seen        map[string]string
	invocations map[string]*invState // base invocation id -> state
	// Counters over invocations, kept as they change, so that primitives
	// asking about them on every event cost O(1), not O(invocations).
	byFn             map[string]*fnCount
	running, failing int // invocations running / failed (see running)
	// What the session holds, counted against the limits (limits.go):
	// objects and bytes charged, those owed by the event being handled,
	// and its namespace's usage (nil once released).
	objects, bytes         int64
	debtObjects, debtBytes int64
	ns                     *usage
}

// fnCount counts one function's invocations.
type fnCount struct{ total, running, failed int }

type invState struct {
	Function string `json:"function"`
	Started  bool   `json:"started,omitempty"` // a FunctionStarted arrived
	Finished bool   `json:"finished"`
	Failed   bool   `json:"failed,omitempty"`
	Sent     int    `json:"sent,omitempty"` // outputs it said it sent (Finish.Outputs)
	Got      int    `json:"got,omitempty"`  // distinct outputs counted
	// Reruns are the re-executions the engine issued for it (raw
	// invocation ids), true while one may still run; Copies names those
	// that are speculative copies; OrigEnded says the original execution
	// ended. While another execution may still run, a failure of one is
	// not the invocation's failure (else a re-execution's outputs arriving
	// after its original failed could find the invocation given up and a
	// DynamicGroup closed). A re-execution that ended does not reopen the
	// invocation when a resent start of it arrives, and a copy that starts
	// after its original finished, with no trigger waiting for its output,
	// does not reopen it either: the first execution to finish wins.
	Reruns    map[string]bool `json:"reruns,omitempty"`
	Succeeded bool            `json:"succeeded,omitempty"` // some execution finished without failing
	Copies    []string        `json:"copies,omitempty"`
	OrigEnded bool            `json:"origEnded,omitempty"`
	// Upstream are the invocations whose outputs fired it (SourceEvent.Upstream).
	Upstream []string `json:"upstream,omitempty"`
	// Args are what it was started with (FunctionStarted's), kept while
	// it has not finished: a new owner sends it again from them when no
	// outcome of it arrives (Engine.InFlight).
	Args []byte `json:"args,omitempty"`
	// Issued says the engine sent it itself under a delegated firing's id
	// (a delegable trigger's firing no sidecar claimed): it is the
	// engine's to send again, as any invocation it issued, not a
	// sidecar's.
	Issued bool `json:"issued,omitempty"`
}

// engines reports whether the engine issued the invocation id of session
// s (and so keeps its arguments and sends it again after a restore): its
// sequential ids, and a delegated firing's id it sent itself.
func (s *session) engines(id string, inv *invState) bool {
	return inv.Issued || !strings.HasPrefix(id, s.id+".d")
}

// upstreamOf lists, once each and in order, the base invocations that
// produced objs.
func upstreamOf(objs []Object) []string {
	var out []string
	for _, o := range objs {
		if b := BaseInvocation(o.Invocation); b != "" && !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	return out
}

// racing reports whether an execution of the invocation other than raw
// (its own id, or a re-execution's) may still run.
func (inv *invState) racing(base, raw string) bool {
	if len(inv.Reruns) == 0 {
		return false
	}
	if raw != base && !inv.OrigEnded {
		return true
	}
	for id, live := range inv.Reruns {
		if live && id != raw {
			return true
		}
	}
	return false
}

// active reports whether an invocation may still produce output: not
// finished, or finished with outputs not yet counted; a failed one may
// still run again when a re-execution is pending (see Outstanding).
func (inv *invState) active() bool { return !inv.Finished || inv.Got < inv.Sent }

func (inv *invState) failed() bool { return inv.Finished && inv.Failed }

// orphan reports whether id, unknown to the session, has the form of an
// invocation the engine issues ("<session>.<n>"): an engine records every
// invocation it decides before it is sent, so an unknown one was decided by
// a previous owner after its last save, which this owner restored without
// that decision (the owner crashed). Its events are dropped: the outcome
// that made the decision (not acknowledged, so sent again, or sent again by
// redispatch) makes this owner decide again, under new ids (SeqBlock), and
// counting the orphan's outputs or waiting for them would hold the
// triggers (a DynamicGroup waits for quiescence, a DynamicJoin for its
// declarers; the chaos checker's stuck fan sessions). A delegated firing's
// id ("<session>.d...") is the producer sidecar's, not the engine's.
//
// Only a restored session has orphans (its counter jumped to a SeqBlock),
// and only below its counter: an id no engine handed out yet is made up,
// and kept as an invocation the engine did not issue.
func (s *session) orphan(id string) bool {
	if s.seq < SeqBlock {
		return false
	}
	digits, ok := strings.CutPrefix(id, s.id+".")
	if !ok || digits == "" || len(digits) > 9 {
		return false
	}
	n, err := strconv.Atoi(digits)
	return err == nil && digits[0] != '+' && digits[0] != '-' && n < s.seq
}

// track adds a new invocation to the session's counters.
func (s *session) track(id string, inv *invState) {
	s.invocations[id] = inv
	c := s.fn(inv.Function)
	c.total++
	s.account(c, inv, 1)
}

// change applies fn to an invocation, keeping the counters right.
func (s *session) change(inv *invState, fn func()) {
	c := s.fn(inv.Function)
	s.account(c, inv, -1)
	fn()
	s.account(c, inv, 1)
}

func (s *session) account(c *fnCount, inv *invState, d int) {
	if inv.active() {
		c.running += d
		s.running += d
	}
	if inv.failed() {
		c.failed += d
		s.failing += d
	}
}

func (s *session) fn(name string) *fnCount {
	if s.byFn == nil {
		s.byFn = map[string]*fnCount{}
	}
	c := s.byFn[name]
	if c == nil {
		c = &fnCount{}
		s.byFn[name] = c
	}
	return c
}

// seenKey records that invocation inv sent name although another
// invocation sent it first.
func seenKey(inv, name string) string { return "\x00" + inv + "\x00" + name }

// count counts an output toward its invocation, once per invocation and
// name, and returns the invocation when that was the last output it said
// it sent.
func (s *session) count(base, name string, dup bool, firstBy, early string) *invState {
	if base == "" {
		return nil
	}
	inv := s.invocations[base]
	if inv == nil && early != "" {
		inv = &invState{Function: early} // made by a sidecar, claimed later
		s.track(base, inv)
		s.owe(1, int64(len(base)+len(early)))
	}
	if inv == nil {
		return nil // not dispatched here: nothing waits for its outputs
	}
	if dup {
		if firstBy == base {
			return nil
		}
		k := seenKey(base, name)
		if _, ok := s.seen[k]; ok {
			return nil
		}
		s.seen[k] = base
		s.owe(1, int64(len(k)))
	}
	s.change(inv, func() { inv.Got++ })
	if inv.Finished && !inv.Failed && inv.Got == inv.Sent {
		return inv
	}
	return nil
}

func (s *session) state(t *trigger) *State {
	st := s.states[t.spec.Name]
	if st == nil {
		st = &State{}
		s.states[t.spec.Name] = st
	}
	return st
}

// Outstanding implements SessionView: invocations of fn not finished, with
// outputs not yet counted, or failed with a re-execution pending.
func (s *session) Outstanding(fn string) int {
	c := s.byFn[fn]
	if c == nil {
		return 0
	}
	n := c.running
	if c.failed > 0 && s.rerunPending(fn) {
		n += c.failed
	}
	return n
}

// Quiescent implements SessionView.
func (s *session) Quiescent() bool {
	if s.running > 0 {
		return false
	}
	if s.failing > 0 {
		for fn, c := range s.byFn {
			if c.failed > 0 && s.rerunPending(fn) {
				return false
			}
		}
	}
	return true
}

// awaited reports whether some trigger still waits for an output of
// invocation inv (a re-execution rule's pending entry).
func (s *session) awaited(inv string) bool {
	for _, st := range s.states {
		if _, ok := st.Pending[inv]; ok {
			return true
		}
	}
	return false
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
	if c := s.byFn[fn]; c != nil {
		return c.total
	}
	return 0
}

// BaseInvocation strips a re-execution suffix: "s.3.r2" -> "s.3".
func BaseInvocation(id string) string {
	if i := strings.LastIndex(id, ".r"); i > 0 {
		if _, err := strconv.Atoi(id[i+2:]); err == nil {
			return id[:i]
		}
	}
	return id
}
