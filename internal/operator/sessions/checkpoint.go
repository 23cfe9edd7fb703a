package sessions

import "time"

// Incremental checkpoints (internal/operator/orchestrator checkpoint.go): the
// periodic save holds the running sessions; an ended session is written
// once, when it ends (again if it changes later), and deleted when pruned.

// Version changes whenever a session starts, changes or is forgotten: a
// save with the version of the last one has nothing new to write.
func (r *Registry) Version() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// Running returns the running sessions (whatever the number of ended ones
// kept).
func (r *Registry) Running() []Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Session, 0, len(r.running))
	for _, e := range r.running {
		out = append(out, clone(e.s))
	}
	return out
}

// TakeEnded returns the sessions that ended or changed after ending since
// the last call, and the ids of those Prune forgot meanwhile; the caller
// keeps what it could not write.
func (r *Registry) TakeEnded() (ended []Session, gone []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.dirty {
		if e, ok := r.sessions[id]; ok {
			ended = append(ended, clone(e.s))
		}
	}
	clear(r.dirty)
	gone, r.gone = r.gone, nil
	return ended, gone
}

// DropEnded deletes from m the ids of the sessions the registry holds as
// ended.
func (r *Registry) DropEnded(m map[string]time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range m {
		if e, ok := r.sessions[id]; ok && e.s.State.Ended() {
			delete(m, id)
		}
	}
}
