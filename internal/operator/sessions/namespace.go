package sessions

// Namespace returns a session's namespace without copying the session
// (the control server asks it for every event a sidecar reports).
func (r *Registry) Namespace(id string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sessions[id]
	if !ok {
		return "", false
	}
	return e.s.Namespace, true
}
