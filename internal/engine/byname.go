package engine

import (
	"errors"
	"time"
)

// byName fires when an object with one given key arrives (a Choice branch).
type byName struct {
	reruns
	key string
}

func newByName(spec TriggerSpec) (Primitive, error) {
	if spec.Key == "" {
		return nil, errors.New("ByName needs a key")
	}
	return byName{reruns{spec.Reruns}, spec.Key}, nil
}

func (p byName) ActionForNewObject(st *State, _ SessionView, obj *Object, now time.Time) []Firing {
	if obj == nil {
		return nil
	}
	p.arrived(st, obj, now)
	if obj.Key != p.key {
		return nil
	}
	return []Firing{{Objects: []Object{*obj}}}
}

func (p byName) NotifySourceFunc(st *State, _ SessionView, ev SourceEvent, now time.Time) []Firing {
	p.notify(st, ev, now)
	return nil
}

func (p byName) ActionForRerun(st *State, now time.Time) []Rerun { return p.due(st, now) }
func (p byName) NextDeadline(st *State) time.Time                { return p.next(st) }
