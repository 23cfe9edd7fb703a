package orchestrator

import (
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Welcome implements control.Welcomer: the delegated triggers of the
// stream's workflow, from the orchestrator of its bucket (none when this
// replica does not serve it: that stream is redirected before).
func (s *Sharded) Welcome(id control.Identity) []*controlv1.OperatorMessage {
	var out []*controlv1.OperatorMessage
	_ = s.serve(id.Namespace, id.Workflow, func(o *Orchestrator) error { out = o.Welcome(id); return nil })
	return out
}
