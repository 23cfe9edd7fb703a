package engine

import (
	"errors"
	"time"
)

// bySet fires once per session when every key of a static set is present (fan-in).
type bySet struct {
	reruns
	keys map[string]bool
}

func newBySet(spec TriggerSpec) (Primitive, error) {
	if len(spec.Keys) == 0 {
		return nil, errors.New("BySet needs keys")
	}
	keys := map[string]bool{}
	for _, k := range spec.Keys {
		keys[k] = true
	}
	return bySet{reruns{spec.Reruns}, keys}, nil
}

func (p bySet) ActionForNewObject(st *State, _ SessionView, obj *Object, now time.Time) []Firing {
	if obj == nil {
		return nil
	}
	p.arrived(st, obj, now)
	if st.Fired || !p.keys[obj.Key] {
		return nil
	}
	st.Objects = append(st.Objects, *obj)
	if len(st.Objects) < len(p.keys) {
		return nil
	}
	st.Fired = true
	objs := st.Objects
	st.Objects = nil
	return []Firing{{Objects: objs}}
}

func (p bySet) NotifySourceFunc(st *State, _ SessionView, ev SourceEvent, now time.Time) []Firing {
	p.notify(st, ev, now)
	return nil
}

func (p bySet) ActionForRerun(st *State, now time.Time) []Rerun { return p.due(st, now) }
func (p bySet) NextDeadline(st *State) time.Time                { return p.next(st) }
