package engine

import "time"

// immediate fires every object at once (chains, fan-out).
type immediate struct{ reruns }

func newImmediate(spec TriggerSpec) (Primitive, error) { return immediate{reruns{spec.Reruns}}, nil }

func (p immediate) ActionForNewObject(st *State, _ SessionView, obj *Object, now time.Time) []Firing {
	if obj == nil {
		return nil
	}
	p.arrived(st, obj, now)
	return []Firing{{Objects: []Object{*obj}}}
}

func (p immediate) NotifySourceFunc(st *State, _ SessionView, ev SourceEvent, now time.Time) []Firing {
	p.notify(st, ev, now)
	return nil
}

func (p immediate) ActionForRerun(st *State, now time.Time) []Rerun { return p.due(st, now) }
func (p immediate) NextDeadline(st *State) time.Time                { return p.next(st) }
