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

func (p dynamicJoin) ActionForNewObject(st *State, _ SessionView, obj *Object, _ time.Time) []Firing {
	if obj == nil {
		return nil
	}
	p.arrived(st, obj)
	if st.Fired {
		return nil
	}
	if len(p.sources) == 0 || p.sources[obj.Producer] {
		if keys := obj.Metadata[MetaExpectedKeys]; keys != "" {
			if st.Expected == nil {
				st.Expected = map[string]bool{}
			}
			for _, k := range strings.Split(keys, ",") {
				if k = strings.TrimSpace(k); k != "" {
					st.Expected[k] = true
				}
			}
		}
		if n, err := strconv.Atoi(obj.Metadata[MetaExpectedCount]); err == nil && n > st.ExpectedCount {
			st.ExpectedCount = n
		}
	}
	if obj.Metadata[MetaDeclareOnly] != "true" {
		st.Objects = append(st.Objects, *obj)
	}
	return p.check(st)
}

func (p dynamicJoin) check(st *State) []Firing {
	if len(st.Expected) == 0 && st.ExpectedCount == 0 {
		return nil // nothing declared yet
	}
	have := map[string]bool{}
	for _, o := range st.Objects {
		have[o.Key] = true
	}
	for k := range st.Expected {
		if !have[k] {
			return nil
		}
	}
	if len(st.Objects) < st.ExpectedCount {
		return nil
	}
	st.Fired = true
	objs := st.Objects
	st.Objects = nil
	return []Firing{{Objects: objs}}
}

func (p dynamicJoin) NotifySourceFunc(st *State, _ SessionView, ev SourceEvent, now time.Time) []Firing {
	p.notify(st, ev, now)
	return nil
}

func (p dynamicJoin) ActionForRerun(st *State, now time.Time) []Rerun { return p.due(st, now) }
func (p dynamicJoin) NextDeadline(st *State) time.Time                { return p.next(st) }
