package engine

import (
	"errors"
	"time"
)

// byTime fires with all objects accumulated in a window of Window, which
// opens with the first object after the previous firing and closes on the
// clock, whether or not more objects arrive (periodic aggregation).
type byTime struct {
	reruns
	window time.Duration
}

func newByTime(spec TriggerSpec) (Primitive, error) {
	if spec.Window <= 0 {
		return nil, errors.New("ByTime needs a positive window")
	}
	return byTime{reruns{spec.Reruns}, spec.Window}, nil
}

func (p byTime) ActionForNewObject(st *State, _ SessionView, obj *Object, now time.Time) []Firing {
	var fired []Firing
	if !st.WindowEnd.IsZero() && !now.Before(st.WindowEnd) {
		fired = []Firing{{Objects: st.Objects}}
		st.Objects, st.WindowEnd = nil, time.Time{}
	}
	if obj != nil {
		p.arrived(st, obj, now)
		if st.WindowEnd.IsZero() {
			st.WindowEnd = now.Add(p.window)
		}
		st.Objects = append(st.Objects, *obj)
	}
	return fired
}

func (p byTime) NotifySourceFunc(st *State, _ SessionView, ev SourceEvent, now time.Time) []Firing {
	p.notify(st, ev, now)
	return nil
}

func (p byTime) ActionForRerun(st *State, now time.Time) []Rerun { return p.due(st, now) }
func (p byTime) NextDeadline(st *State) time.Time {
	return earliest(st.WindowEnd, p.next(st))
}
