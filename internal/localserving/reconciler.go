package localserving

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Reconciler runs the pods of Knative Services and writes their status the
// way Knative's service controller would: URL, address, Ready.
type Reconciler struct {
	client.Client
	Runtime *Runtime
	events  chan event.TypedGenericEvent[*servingv1.Service]
}

// Reconcile starts, replaces or stops a Service's pods.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	svc := &servingv1.Service{}
	if err := r.Get(ctx, req.NamespacedName, svc); err != nil {
		if apierrors.IsNotFound(err) {
			r.Runtime.remove(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if !svc.DeletionTimestamp.IsZero() {
		r.Runtime.remove(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	ready, err := r.Runtime.ensure(ctx, svc)

	before := svc.DeepCopy()
	svc.Status.ObservedGeneration = svc.Generation
	url, perr := apis.ParseURL(r.Runtime.URL(svc.Namespace, svc.Name))
	if perr == nil {
		svc.Status.URL = url
		svc.Status.Address = &duckv1.Addressable{URL: url}
	}
	rev := revisionName(svc)
	svc.Status.LatestCreatedRevisionName = rev
	cond := apis.Condition{Type: apis.ConditionReady, Status: corev1.ConditionTrue, LastTransitionTime: apis.VolatileTime{Inner: nowTime()}}
	switch {
	case err != nil:
		cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, "LocalPodFailed", err.Error()
	case ready == 0:
		cond.Status, cond.Reason, cond.Message = corev1.ConditionUnknown, "NoReadyPods", "waiting for a pod to become ready"
	default:
		svc.Status.LatestReadyRevisionName = rev
	}
	svc.Status.Conditions = duckv1.Conditions{
		cond,
		{Type: servingv1.ServiceConditionConfigurationsReady, Status: cond.Status, Reason: cond.Reason, Message: cond.Message},
		{Type: servingv1.ServiceConditionRoutesReady, Status: cond.Status, Reason: cond.Reason, Message: cond.Message},
	}
	if serr := r.Status().Patch(ctx, svc, client.MergeFrom(before)); serr != nil && !apierrors.IsNotFound(serr) {
		return ctrl.Result{}, serr
	}
	if err != nil {
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	}
	return ctrl.Result{}, nil
}

// SetupWithManager watches Knative Services and the runtime's own pod exits.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.events = make(chan event.TypedGenericEvent[*servingv1.Service], 64)
	r.Runtime.onPod = func(key types.NamespacedName) {
		svc := &servingv1.Service{}
		svc.Namespace, svc.Name = key.Namespace, key.Name
		r.events <- event.TypedGenericEvent[*servingv1.Service]{Object: svc}
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&servingv1.Service{}).
		WatchesRawSource(source.Channel(r.events, &handler.TypedEnqueueRequestForObject[*servingv1.Service]{})).
		Named("localserving").
		// Starting a pod waits for its readiness; Services start in parallel.
		WithOptions(controller.Options{MaxConcurrentReconciles: 8}).
		Complete(r)
}
