package engine

import (
	"errors"
	"sort"
	"time"
)

// dynamicGroup divides objects into groups named by a metadata entry; once
// the source functions have run and the session is quiescent (every
// invocation finished, every output it sent counted, so no mapper can
// still be dispatched), each group fires the targets once with its objects
// (MapReduce shuffle).
type dynamicGroup struct {
	reruns
	key     string
	sources []string
}

func newDynamicGroup(spec TriggerSpec) (Primitive, error) {
	if len(spec.Sources) == 0 {
		return nil, errors.New("DynamicGroup needs source functions")
	}
	key := spec.GroupMetadataKey
	if key == "" {
		key = "group"
	}
	return dynamicGroup{reruns{spec.Reruns}, key, spec.Sources}, nil
}

func (p dynamicGroup) ActionForNewObject(st *State, s SessionView, obj *Object, now time.Time) []Firing {
	if obj == nil {
		return nil
	}
	p.arrived(st, obj, now)
	if st.Fired {
		return nil
	}
	g := obj.Metadata[p.key]
	if st.Groups == nil {
		st.Groups = map[string][]Object{}
	}
	st.Groups[g] = append(st.Groups[g], *obj)
	return nil
}

func (p dynamicGroup) NotifySourceFunc(st *State, s SessionView, ev SourceEvent, now time.Time) []Firing {
	p.notify(st, ev, now)
	if st.Fired || !ev.Finished {
		return nil
	}
	for _, src := range p.sources {
		if s.Invocations(src) == 0 {
			return nil
		}
	}
	// Not only the mappers known so far: whatever still runs (the splitter
	// feeding them, a mapper whose outputs are still on their way) may add
	// a mapper or an output.
	if !s.Quiescent() {
		return nil
	}
	st.Fired = true
	st.Pending, st.Waves = nil, nil
	names := make([]string, 0, len(st.Groups))
	for g := range st.Groups {
		names = append(names, g)
	}
	sort.Strings(names)
	fired := make([]Firing, 0, len(names))
	for _, g := range names {
		fired = append(fired, Firing{Objects: st.Groups[g], Group: g})
	}
	st.Groups = nil
	return fired
}

func (p dynamicGroup) ActionForRerun(st *State, now time.Time) []Rerun { return p.due(st, now) }
func (p dynamicGroup) NextDeadline(st *State) time.Time                { return p.next(st) }
