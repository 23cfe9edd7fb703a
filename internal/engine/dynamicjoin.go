package engine

import (
	"strconv"
	"strings"
	"time"
)

// dynamicJoin fires once when the set of objects declared at run time is
// complete (dynamic Map). A producer declares the set with object metadata:
// MetaExpectedKeys (the keys) or MetaExpectedCount (how many); a
// declaration-only object (MetaDeclareOnly) is not itself a member.
//
// Declared keys are the members: other objects of the bucket are neither
// passed on nor counted. Several producers may declare: their keys add up;
// a count is the total (members commonly each carry it), the largest
// declared wins. The join waits until no declaring function still runs, so
// a second producer's declaration is never cut off by the first one's
// members: the declaring functions are the trigger's sources, or, with no
// sources, the functions that declared so far.
type dynamicJoin struct {
	reruns
	sources map[string]bool // who may declare; empty: anyone
}

func newDynamicJoin(spec TriggerSpec) (Primitive, error) {
	src := map[string]bool{}
	for _, s := range spec.Sources {
		src[s] = true
	}
	return dynamicJoin{reruns{spec.Reruns}, src}, nil
}

func (p dynamicJoin) ActionForNewObject(st *State, s SessionView, obj *Object, now time.Time) []Firing {
	if obj == nil {
		return nil
	}
	p.arrived(st, obj, now)
	if st.Fired {
		return nil
	}
	if len(p.sources) == 0 || p.sources[obj.Producer] {
		p.declare(st, obj)
	}
	if obj.Metadata[MetaDeclareOnly] != "true" {
		st.Objects = append(st.Objects, *obj)
	}
	return p.check(st, s)
}

// declare records what obj declares about the expected set.
func (p dynamicJoin) declare(st *State, obj *Object) {
	declared := false
	if keys := obj.Metadata[MetaExpectedKeys]; keys != "" {
		if st.Expected == nil {
			st.Expected = map[string]bool{}
		}
		for _, k := range strings.Split(keys, ",") {
			if k = strings.TrimSpace(k); k != "" {
				st.Expected[k] = true
				declared = true
			}
		}
	}
	if n, err := strconv.Atoi(obj.Metadata[MetaExpectedCount]); err == nil && n > 0 {
		st.ExpectedCount = max(st.ExpectedCount, n)
		declared = true
	}
	if declared && len(p.sources) == 0 && obj.Producer != "" {
		if st.Declarers == nil {
			st.Declarers = map[string]bool{}
		}
		st.Declarers[obj.Producer] = true
	}
}

func (p dynamicJoin) check(st *State, s SessionView) []Firing {
	if len(st.Expected) == 0 && st.ExpectedCount == 0 {
		return nil // nothing declared yet
	}
	if len(st.Objects) < max(len(st.Expected), st.ExpectedCount) {
		return nil // cannot be complete yet
	}
	members := st.Objects
	if len(st.Expected) > 0 {
		members = make([]Object, 0, len(st.Expected))
		for _, o := range st.Objects {
			if st.Expected[o.Key] {
				members = append(members, o)
			}
		}
		// Keys are unique per session and bucket: every declared key is
		// present exactly when the counts match.
		if len(members) < len(st.Expected) {
			return nil
		}
	}
	if len(members) < st.ExpectedCount {
		return nil
	}
	declarers := p.sources
	if len(declarers) == 0 {
		declarers = st.Declarers
	}
	for fn := range declarers {
		if s.Outstanding(fn) > 0 {
			return nil // it may still declare more
		}
	}
	st.Fired = true
	st.Objects = nil
	return []Firing{{Objects: members}}
}

func (p dynamicJoin) NotifySourceFunc(st *State, s SessionView, ev SourceEvent, now time.Time) []Firing {
	p.notify(st, ev, now)
	if !ev.Finished || st.Fired {
		return nil
	}
	return p.check(st, s) // a declaring function finishing may complete the join
}

func (p dynamicJoin) ActionForRerun(st *State, now time.Time) []Rerun { return p.due(st, now) }
func (p dynamicJoin) NextDeadline(st *State) time.Time                { return p.next(st) }
