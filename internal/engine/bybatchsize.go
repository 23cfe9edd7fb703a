package engine

import (
	"errors"
	"time"
)

// byBatchSize fires with every Size accumulated objects (Pheromone Fig. A.1).
type byBatchSize struct {
	reruns
	size int
}

func newByBatchSize(spec TriggerSpec) (Primitive, error) {
	if spec.BatchSize < 1 {
		return nil, errors.New("ByBatchSize needs a batch size >= 1")
	}
	return byBatchSize{reruns{spec.Reruns}, spec.BatchSize}, nil
}

func (p byBatchSize) ActionForNewObject(st *State, _ SessionView, obj *Object, now time.Time) []Firing {
	if obj == nil {
		return nil
	}
	p.arrived(st, obj, now)
	st.Objects = append(st.Objects, *obj)
	if len(st.Objects) < p.size {
		return nil
	}
	batch := st.Objects
	st.Objects = nil
	return []Firing{{Objects: batch}}
}

func (p byBatchSize) NotifySourceFunc(st *State, _ SessionView, ev SourceEvent, now time.Time) []Firing {
	p.notify(st, ev, now)
	return nil
}

func (p byBatchSize) ActionForRerun(st *State, now time.Time) []Rerun { return p.due(st, now) }
func (p byBatchSize) NextDeadline(st *State) time.Time                { return p.next(st) }
