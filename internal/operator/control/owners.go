package control

import (
	"container/list"
	"sync"
	"time"
)

// owners records which pod an invocation belongs to, so that a pod reports
// only its own invocations: the first pod that reports an invocation
// (normally its FunctionStarted) owns it, and events from any other pod
// naming it are refused while the owner is connected. Ownership passes on
// only when the owner has no stream left (it died or is reconnecting): the
// dispatcher retries an invocation whose pod went away, and the retry lands
// on another pod.
//
// The table is bounded: an invocation is forgotten idle after ownerIdle,
// finishGrace after its owner reported it finished (late object reports of
// the same pod still match), or, oldest first, beyond maxOwners entries.
type owners struct {
	mu    sync.Mutex
	byKey map[string]*list.Element
	lru   *list.List // of *owner, most recently used first
	max   int
}

type owner struct {
	key     string
	pod     string // podKey of the owner
	expires time.Time
}

const (
	ownerIdle   = 15 * time.Minute
	finishGrace = 2 * time.Minute
	maxOwners   = 1 << 17
)

func newOwners() *owners {
	return &owners{byKey: map[string]*list.Element{}, lru: list.New(), max: maxOwners}
}

// claim records that pod reported invocation inv of namespace ns (finished:
// its FunctionFinished). It returns the current owner and false when
// another pod owns it and live(owner) says that pod is still connected.
func (o *owners) claim(ns, inv, pod string, finished bool, now time.Time, live func(pod string) bool) (string, bool) {
	key := ns + "\x00" + inv
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expire(now)
	exp := now.Add(ownerIdle)
	if finished {
		exp = now.Add(finishGrace)
	}
	if e, ok := o.byKey[key]; ok {
		w := e.Value.(*owner)
		if w.pod != pod && now.Before(w.expires) && live(w.pod) {
			return w.pod, false
		}
		w.pod, w.expires = pod, exp
		o.lru.MoveToFront(e)
		return pod, true
	}
	o.byKey[key] = o.lru.PushFront(&owner{key: key, pod: pod, expires: exp})
	for o.lru.Len() > o.max {
		o.remove(o.lru.Back())
	}
	return pod, true
}

// expire drops expired entries from the least recently used end.
func (o *owners) expire(now time.Time) {
	for e := o.lru.Back(); e != nil; e = o.lru.Back() {
		if now.Before(e.Value.(*owner).expires) {
			return
		}
		o.remove(e)
	}
}

func (o *owners) remove(e *list.Element) {
	delete(o.byKey, e.Value.(*owner).key)
	o.lru.Remove(e)
}

func (o *owners) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lru.Len()
}
