package orchestrator

// SessionNamespace implements control.SessionScope: the control server
// refuses a sidecar's event naming a session of another namespace than the
// sidecar's (the engine finds sessions by id alone).
func (o *Orchestrator) SessionNamespace(session string) (string, bool) {
	return o.sessions.Namespace(session)
}
