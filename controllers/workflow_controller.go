package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// WorkflowFinalizer lets the operator delete a workflow's children (and, with
// the engine, its sessions) before the Workflow disappears, so cleanup does
// not depend on a garbage collector being present.
const WorkflowFinalizer = "ziptrail.dev/workflow-cleanup"

// WorkflowReconciler turns a Workflow into one Knative Service per function
// plus its Buckets and Triggers, and reports their readiness.
type WorkflowReconciler struct {
	client.Client
	Recorder events.EventRecorder
	// Sink, when set, receives every reconciled workflow (the operator's
	// orchestrator, which runs the trigger engine and the sessions).
	Sink WorkflowSink
	// ControlAddr is the operator's control Service, written on every
	// function's revision template for queue-proxy-zl (Tiers.ControlAddr).
	ControlAddr string
	// TriggerStatusInterval is the least time between two writes of a
	// child Trigger's counters; default DefaultTriggerStatusInterval.
	TriggerStatusInterval time.Duration
	// Nodes, when set, lists the cluster's nodes (uncached: read at most
	// once a minute) to say why a function's pods cannot be scheduled
	// (workflow_fit.go).
	Nodes client.Reader

	triggerWrites triggerWrites
	nodesOnce     sync.Once
	nodes         *nodeMemory
}

// WorkflowSink is what the trigger engine's side needs from reconciles.
type WorkflowSink interface {
	SetWorkflow(wf *v1alpha1.Workflow, ready bool, notReady string) error
	RemoveWorkflow(namespace, name string)
	SessionCounts(namespace, name string) v1alpha1.SessionCounts
	// TriggerCounts are the counters of the workflow's triggers, by their
	// names inside the workflow: Firings, Reexecutions, SpeculativeCopies
	// and LastFiredTime of their child Triggers' status, cumulative.
	TriggerCounts(namespace, name string) map[string]v1alpha1.TriggerStatus
	// Changes names workflows whose session counts changed.
	Changes() <-chan event.TypedGenericEvent[*v1alpha1.Workflow]
}

// +kubebuilder:rbac:groups=ziptrail.dev,resources=workflows,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=ziptrail.dev,resources=workflows/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=ziptrail.dev,resources=workflows/finalizers,verbs=update
// +kubebuilder:rbac:groups=ziptrail.dev,resources=buckets;triggers,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=serving.knative.dev,resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings a Workflow's children in line with its spec.
func (r *WorkflowReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	wf := &v1alpha1.Workflow{}
	if s, ok := r.sharded(); ok && !s.Owns(req.NamespacedName) {
		return ctrl.Result{}, nil // another replica's bucket: its owner reconciles it
	}
	if err := r.Get(ctx, req.NamespacedName, wf); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !wf.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, wf)
	}
	if controllerutil.AddFinalizer(wf, WorkflowFinalizer) {
		if err := r.Update(ctx, wf); err != nil {
			return ctrl.Result{}, err
		}
	}

	// Status is patched once, at the end, whatever happened in between.
	before := wf.DeepCopy()
	wasReady := readyStatus(wf.Status.Conditions)
	r.setEngineStatus(wf)
	defer func() {
		wf.Status.ObservedGeneration = wf.Generation
		if err := r.Status().Patch(ctx, wf, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
			reterr = errors.Join(reterr, fmt.Errorf("patch workflow status: %w", err))
		}
		if now := readyStatus(wf.Status.Conditions); now != wasReady {
			if now == metav1.ConditionTrue {
				r.Recorder.Eventf(wf, nil, corev1.EventTypeNormal, "Ready", "Reconcile", "all %d functions are ready", len(wf.Spec.Functions))
			} else {
				r.Recorder.Eventf(wf, nil, corev1.EventTypeWarning, "NotReady", "Reconcile", "%s", readyMessage(wf.Status.Conditions))
			}
		}
	}()

	want, err := desiredChildren(wf, r.ControlAddr)
	if err != nil {
		setCondition(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionTargetsResolved, false, v1alpha1.ReasonInvalidSpec, err.Error())
		setReady(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionTargetsResolved)
		r.Recorder.Eventf(wf, nil, corev1.EventTypeWarning, v1alpha1.ReasonInvalidSpec, "Compile", "%v", err)
		return ctrl.Result{}, nil // the spec must change first; retrying cannot help
	}
	if len(want.problems) > 0 {
		setCondition(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionTargetsResolved, false, v1alpha1.ReasonTargetNotFound, strings.Join(want.problems, "; "))
	} else {
		setCondition(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionTargetsResolved, true, v1alpha1.ReasonReconciled, "")
	}

	if err := r.applyChildren(ctx, wf, want); err != nil {
		var conflict *childConflictError
		if errors.As(err, &conflict) {
			setCondition(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionServicesReady, false, v1alpha1.ReasonChildConflict, conflict.Error())
			setReady(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionTargetsResolved, v1alpha1.ConditionServicesReady)
			r.Recorder.Eventf(wf, nil, corev1.EventTypeWarning, v1alpha1.ReasonChildConflict, "Apply", "%v", conflict)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}

	serving := r.updateServiceStatus(ctx, wf, want.services)
	setReady(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionTargetsResolved, v1alpha1.ConditionServicesReady)
	wf.Status.Functions = int32(len(wf.Spec.Functions))
	if r.Sink != nil {
		// Sessions are admitted while every function serves traffic, even
		// when a Service is not Ready because Knative is rolling out a new
		// revision of it: its Route keeps sending requests to the previous
		// ready revision meanwhile, so refusing sessions would make every
		// update of a function an outage.
		ready := readyStatus(wf.Status.Conditions) == metav1.ConditionTrue ||
			(serving && meta.IsStatusConditionTrue(wf.Status.Conditions, v1alpha1.ConditionTargetsResolved))
		if err := r.Sink.SetWorkflow(wf, ready, readyMessage(wf.Status.Conditions)); err != nil {
			setCondition(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionReady, false, v1alpha1.ReasonInvalidSpec, "trigger engine: "+err.Error())
			return ctrl.Result{}, nil
		}
		wf.Status.Sessions = r.Sink.SessionCounts(wf.Namespace, wf.Name)
		// The triggers' counters, held back by their rate limit or not.
		requeue := r.updateTriggerCounts(ctx, wf)
		if wf.Status.Sessions.Active > 0 && (requeue == 0 || requeue > 5*time.Second) {
			// Session counters move without spec changes: refresh them.
			requeue = 5 * time.Second
		}
		if requeue > 0 {
			return ctrl.Result{RequeueAfter: requeue}, nil
		}
	}
	log.FromContext(ctx).V(1).Info("reconciled workflow", "services", len(want.services), "buckets", len(want.buckets), "triggers", len(want.triggers))
	return ctrl.Result{}, nil
}

// updateServiceStatus sets ServicesReady from the Knative Services' own
// Ready conditions. It reports whether every Service serves traffic
// (servesTraffic), Ready or not.
func (r *WorkflowReconciler) updateServiceStatus(ctx context.Context, wf *v1alpha1.Workflow, services []*servingv1.Service) (serving bool) {
	var notReady []string
	var notReadySvcs []*servingv1.Service
	serving = true
	for _, want := range services {
		got := &servingv1.Service{}
		err := r.Get(ctx, client.ObjectKeyFromObject(want), got)
		if err != nil || !got.IsReady() {
			notReady = append(notReady, want.Name)
			notReadySvcs = append(notReadySvcs, want)
		}
		if err != nil || !servesTraffic(got) {
			serving = false
		}
	}
	if len(notReady) > 0 {
		if problems := r.fitProblems(ctx, notReadySvcs); len(problems) > 0 {
			setCondition(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionServicesReady, false, v1alpha1.ReasonDoesNotFit, strings.Join(problems, "; "))
			return serving
		}
		setCondition(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionServicesReady, false, v1alpha1.ReasonServiceNotReady,
			fmt.Sprintf("Knative Services not ready: %s", strings.Join(notReady, ", ")))
		return serving
	}
	setCondition(&wf.Status.Conditions, wf.Generation, v1alpha1.ConditionServicesReady, true, v1alpha1.ReasonServicesReady, "")
	return serving
}

// servesTraffic reports whether a Knative Service's Route sends requests to
// a ready revision: its status has a URL and traffic that Knative's Route
// reconciler published (it publishes traffic only once the ingress serves
// it, and keeps the previous traffic while a new revision rolls out or
// fails to start).
func servesTraffic(s *servingv1.Service) bool {
	if s.Status.URL == nil || s.Status.LatestReadyRevisionName == "" {
		return false
	}
	for _, t := range s.Status.Traffic {
		if t.RevisionName != "" && t.Percent != nil && *t.Percent > 0 {
			return true
		}
	}
	return false
}

// SetupWithManager watches Workflows and everything they own.
func (r *WorkflowReconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Workflow{}).
		Owns(&servingv1.Service{}).
		Owns(&v1alpha1.Bucket{}).
		Owns(&v1alpha1.Trigger{}, builder.WithPredicates(childSpecChanged)).
		Named("workflow")
	if _, ok := r.sharded(); ok {
		// Every replica reconciles the workflows of its own buckets.
		b = b.WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)})
	}
	if r.Sink != nil {
		b = b.WatchesRawSource(source.Channel(r.Sink.Changes(), &handler.TypedEnqueueRequestForObject[*v1alpha1.Workflow]{}))
	}
	return b.Complete(r)
}
