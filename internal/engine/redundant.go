package engine

import (
	"errors"
	"time"
)

// redundant fires exactly once per session, on the k-th distinct object of
// n expected; later objects (stragglers) fire nothing (k-out-of-n).
type redundant struct {
	reruns
	k, n int
}

func newRedundant(spec TriggerSpec) (Primitive, error) {
	if spec.K < 1 || spec.N < spec.K {
		return nil, errors.New("Redundant needs 1 <= k <= n")
	}
	return redundant{reruns{spec.Reruns}, spec.K, spec.N}, nil
}

func (p redundant) ActionForNewObject(st *State, _ SessionView, obj *Object, now time.Time) []Firing {
	if obj == nil {
		return nil
	}
	p.arrived(st, obj, now)
	if st.Fired {
		return nil
	}
	st.Objects = append(st.Objects, *obj)
	if len(st.Objects) < p.k {
		return nil
	}
	st.Fired = true
	// The stragglers' re-executions are moot once k arrived.
	st.Pending, st.Waves = nil, nil
	objs := st.Objects
	st.Objects = nil
	return []Firing{{Objects: objs}}
}

func (p redundant) NotifySourceFunc(st *State, _ SessionView, ev SourceEvent, now time.Time) []Firing {
	if !st.Fired {
		p.notify(st, ev, now)
	}
	return nil
}

func (p redundant) ActionForRerun(st *State, now time.Time) []Rerun { return p.due(st, now) }
func (p redundant) NextDeadline(st *State) time.Time                { return p.next(st) }
