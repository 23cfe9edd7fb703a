// Package controllers holds ziptrail's reconcilers: Workflow (Knative
// Services, Buckets and Triggers it owns), Bucket (tiers) and Trigger
// (references), one file per concern.
package controllers

import (
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
)

// Reference keys live in one Secret per namespace (internal/operator/control).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update

// The control stream authenticates sidecars and activator-ext with
// TokenReview (internal/operator/control.TokenReviewer).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create

// Direct routing (internal/operator/dispatch/direct) reads the revisions' private
// EndpointSlices for their ready pods.
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// The same router checks every endpoint against the revision's running pods
// (direct.PodIPs): an EndpointSlice alone may be a tenant's.
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// The Workflow controller reads the nodes' allocatable memory to say why a
// function's pods cannot fit (workflow_fit.go).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list

// Leader election (cmd/operator --leader-elect) uses a Lease.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete

// Setup registers every ziptrail reconciler with the manager.
// sink may be nil (no trigger engine in this process).
func Setup(mgr ctrl.Manager, tiers Tiers, sink WorkflowSink) error {
	if err := (&WorkflowReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ziptrail-workflow"), Sink: sink,
		ControlAddr: tiers.ControlAddr, Nodes: mgr.GetAPIReader()}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("workflow controller: %w", err)
	}
	if err := (&BucketReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ziptrail-bucket"), Tiers: tiers}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("bucket controller: %w", err)
	}
	if err := (&TriggerReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ziptrail-trigger")}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("trigger controller: %w", err)
	}
	return nil
}
