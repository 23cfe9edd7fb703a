package control

import "github.com/ziptrail/ziptrail/internal/operator/control/controlv1"

// Welcomer, when the Events given to NewServer implement it, gives the
// messages a sidecar gets once its stream is accepted, after its Keys:
// its workflow's delegated triggers (docs/control-stream.md, "Delegated
// firing"). id is the stream's authenticated identity; its Workflow is the
// Hello's.
type Welcomer interface {
	Welcome(id Identity) []*controlv1.OperatorMessage
}

// SendWorkflow queues m for every connected sidecar of one workflow (its
// Hello's) in a namespace; a sidecar that cannot take it within
// SendTimeout is disconnected (it reconnects and is welcomed again).
func (s *Server) SendWorkflow(namespace, workflow string, m *controlv1.OperatorMessage) error {
	return s.send(func(id Identity) bool { return id.Namespace == namespace && id.Workflow == workflow }, m)
}

func (s *Server) welcome(c *conn) []*controlv1.OperatorMessage {
	if w, ok := s.events.(Welcomer); ok {
		return w.Welcome(c.id)
	}
	return nil
}
