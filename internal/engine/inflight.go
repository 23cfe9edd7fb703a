package engine

// InFlight is an invocation the engine issued that has not finished.
type InFlight struct {
	Workflow, Session, Function, Invocation string
	// Args are what it was started with (FunctionStarted's), from which
	// its envelope is built again.
	Args []byte
}

// InFlight lists the invocations the engine itself issued (not a sidecar's
// delegated firings, nor re-executions, which have their own rules; a
// delegable firing no sidecar claimed is the engine's: invState.Issued) that
// have started and not finished: after a restore, those whose outcome
// never arrives are sent again by their new owner, under the same id.
func (e *Engine) InFlight() []InFlight {
	var out []InFlight
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.Lock()
		for _, s := range sh.sessions {
			for id, inv := range s.invocations {
				if inv.Finished || !inv.Started || len(inv.Args) == 0 || !s.engines(id, inv) {
					continue
				}
				out = append(out, InFlight{Workflow: s.wf, Session: s.id, Function: inv.Function, Invocation: id, Args: inv.Args})
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// Outstanding reports whether the invocation of a running session has not
// finished (false once it has, or when the session ended).
func (e *Engine) Outstanding(session, invocation string) bool {
	sh := e.shard(session)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.sessions[session]
	if s == nil {
		return false
	}
	inv := s.invocations[invocation]
	return inv != nil && !inv.Finished
}

// Settled reports whether an invocation's outcome needs nothing more: its
// session is not running (ended, collected), or the engine has the
// invocation as finished without failing. An invocation the engine does
// not know (a delegated firing whose start it has not heard of, a
// re-execution's raw id) or has as failed (a late success may follow a
// timed-out call) is not settled.
func (e *Engine) Settled(session, invocation string) bool {
	sh := e.shard(session)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.sessions[session]
	if s == nil {
		return true
	}
	inv := s.invocations[invocation]
	return inv != nil && inv.Finished && !inv.Failed
}
