package controllers

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// finalize deletes every child of a Workflow that is going away and then
// releases the Workflow. Owner references would let a garbage collector do
// the same, but the finalizer also runs where none is present (the local
// cluster) and is where session state will be dropped.
func (r *WorkflowReconciler) finalize(ctx context.Context, wf *v1alpha1.Workflow) error {
	if !controllerutil.ContainsFinalizer(wf, WorkflowFinalizer) {
		return nil
	}
	if _, err := r.deleteOwned(ctx, wf, nil); err != nil {
		return err
	}
	if r.Sink != nil {
		r.Sink.RemoveWorkflow(wf.Namespace, wf.Name)
		r.forgetTriggerWrites(wf)
	}
	controllerutil.RemoveFinalizer(wf, WorkflowFinalizer)
	return r.Update(ctx, wf)
}
