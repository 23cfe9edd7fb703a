package orchestrator

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/control"
)

// loadWorkflowsFor bounds how long Run waits for the Workflows to list
// before it serves without them (the reconciler hands them over later).
const loadWorkflowsFor = 30 * time.Second

// loadWorkflows puts every Workflow into the engine before Run serves
// (Options.LoadWorkflows). The reconciler sets them again as it runs,
// with their conditions' news.
func (o *Orchestrator) loadWorkflows(ctx context.Context) {
	if o.opts.LoadWorkflows == nil {
		return
	}
	deadline := time.Now().Add(loadWorkflowsFor)
	for {
		wfs, err := o.opts.LoadWorkflows(ctx)
		if err == nil {
			for i := range wfs {
				wf := &wfs[i]
				if !wf.DeletionTimestamp.IsZero() {
					continue
				}
				if err := o.SetWorkflow(wf, meta.IsStatusConditionTrue(wf.Status.Conditions, v1alpha1.ConditionReady), ""); err != nil {
					o.opts.Log.Error(err, "load a workflow before serving; its reconciler reports it", "workflow", Key(wf.Namespace, wf.Name))
				}
			}
			o.opts.Log.Info("workflows loaded before serving", "workflows", len(wfs))
			return
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			o.opts.Log.Error(err, "list the workflows; serving without waiting for them")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// awaitServing holds a sidecar's event until Run serves (the checkpoint
// restored, the workflows loaded): applied earlier, an event of a session
// the engine has not restored yet, or of a workflow it does not know yet,
// would be refused and then acknowledged — lost. An owner that stops
// before it serves answers control.ErrMoved: not acknowledged, the
// sidecar sends the event again to whichever owner it reaches next.
func (o *Orchestrator) awaitServing(ctx context.Context) error {
	select {
	case <-o.serving:
		return nil
	default:
	}
	select {
	case <-o.serving:
		return nil
	case <-o.stopped:
		return fmt.Errorf("%w: the engine stopped before it served", control.ErrMoved)
	case <-ctx.Done():
		return ctx.Err()
	}
}
