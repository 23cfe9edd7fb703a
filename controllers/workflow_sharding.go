package controllers

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// ShardedSink is a WorkflowSink whose trigger engine is sharded across
// operator replicas by buckets (docs/sharding.md). Then the Workflow
// controller runs on every replica, without controller-runtime's leader
// election, and each replica reconciles only the workflows of the buckets
// it owns (Knative's own pattern for bucketed controllers): their session
// and trigger counters live in its engine.
type ShardedSink interface {
	WorkflowSink
	// Owns reports whether this replica holds the workflow's bucket.
	Owns(key types.NamespacedName) bool
	// EngineStatus is the workflow's status.engine.
	EngineStatus(namespace, name string) *v1alpha1.WorkflowEngine
}

func (r *WorkflowReconciler) sharded() (ShardedSink, bool) {
	s, ok := r.Sink.(ShardedSink)
	return s, ok
}

// setEngineStatus records the workflow's bucket and owner, with an event
// when the owner changed.
func (r *WorkflowReconciler) setEngineStatus(wf *v1alpha1.Workflow) {
	s, ok := r.sharded()
	if !ok {
		return
	}
	es := s.EngineStatus(wf.Namespace, wf.Name)
	if prev := wf.Status.Engine; prev == nil || *prev != *es {
		from := "none"
		if prev != nil && prev.Owner != "" {
			from = prev.Owner
		}
		r.Recorder.Eventf(wf, nil, corev1.EventTypeNormal, "EngineOwner", "Promote",
			"operator replica %s owns engine bucket %s now (was %s)", es.Owner, es.Bucket, from)
	}
	wf.Status.Engine = es
}
