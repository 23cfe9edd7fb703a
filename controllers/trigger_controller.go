package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// TriggerReconciler resolves a Trigger's bucket and target functions (Knative
// Services of the same namespace) and reports them as conditions.
type TriggerReconciler struct {
	client.Client
	Recorder events.EventRecorder
}

// +kubebuilder:rbac:groups=ziptrail.dev,resources=triggers,verbs=get;list;watch
// +kubebuilder:rbac:groups=ziptrail.dev,resources=triggers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=ziptrail.dev,resources=buckets,verbs=get;list;watch
// +kubebuilder:rbac:groups=serving.knative.dev,resources=services,verbs=get;list;watch

// Reconcile sets BucketResolved, TargetsResolved and Ready on a Trigger.
func (r *TriggerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	t := &v1alpha1.Trigger{}
	if err := r.Get(ctx, req.NamespacedName, t); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := t.DeepCopy()
	wasReady := readyStatus(t.Status.Conditions)
	defer func() {
		t.Status.ObservedGeneration = t.Generation
		if err := r.Status().Patch(ctx, t, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
			reterr = errors.Join(reterr, fmt.Errorf("patch trigger status: %w", err))
		}
		if now := readyStatus(t.Status.Conditions); now != wasReady {
			if now == metav1.ConditionTrue {
				r.Recorder.Eventf(t, nil, corev1.EventTypeNormal, "Ready", "Reconcile", "bucket %s and %d targets resolved", t.Spec.Bucket, len(t.Spec.Targets))
			} else {
				r.Recorder.Eventf(t, nil, corev1.EventTypeWarning, "NotReady", "Reconcile", "%s", readyMessage(t.Status.Conditions))
			}
		}
	}()

	err := r.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.Bucket}, &v1alpha1.Bucket{})
	switch {
	case apierrors.IsNotFound(err):
		setCondition(&t.Status.Conditions, t.Generation, v1alpha1.ConditionBucketResolved, false, v1alpha1.ReasonBucketNotFound,
			fmt.Sprintf("Bucket %q does not exist in namespace %s", t.Spec.Bucket, t.Namespace))
	case err != nil:
		return ctrl.Result{}, err
	default:
		setCondition(&t.Status.Conditions, t.Generation, v1alpha1.ConditionBucketResolved, true, v1alpha1.ReasonReconciled, "")
	}

	var missing []string
	for _, fn := range r.functions(t) {
		err := r.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: fn}, &servingv1.Service{})
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, fn)
		case err != nil:
			return ctrl.Result{}, err
		}
	}
	if len(missing) > 0 {
		setCondition(&t.Status.Conditions, t.Generation, v1alpha1.ConditionTargetsResolved, false, v1alpha1.ReasonTargetNotFound,
			fmt.Sprintf("Knative Services not found: %s", strings.Join(missing, ", ")))
	} else {
		setCondition(&t.Status.Conditions, t.Generation, v1alpha1.ConditionTargetsResolved, true, v1alpha1.ReasonReconciled, "")
	}
	setReady(&t.Status.Conditions, t.Generation, v1alpha1.ConditionBucketResolved, v1alpha1.ConditionTargetsResolved)
	return ctrl.Result{}, nil
}

// functions lists every function a trigger refers to: targets, re-executed
// sources and dynamic primitives' sources.
func (r *TriggerReconciler) functions(t *v1alpha1.Trigger) []string {
	fns := append([]string(nil), t.Spec.Targets...)
	for _, rule := range t.Spec.Reexecution {
		fns = append(fns, rule.SourceFunction)
	}
	if t.Spec.DynamicGroup != nil {
		fns = append(fns, t.Spec.DynamicGroup.Sources...)
	}
	if t.Spec.DynamicJoin != nil {
		fns = append(fns, t.Spec.DynamicJoin.Sources...)
	}
	slices.Sort(fns)
	return slices.Compact(fns)
}

// SetupWithManager watches Triggers, and Buckets and Knative Services so a
// trigger waiting for them is re-resolved as soon as they appear or go.
func (r *TriggerReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Trigger{}).
		Watches(&v1alpha1.Bucket{}, handler.EnqueueRequestsFromMapFunc(r.referencing(func(t *v1alpha1.Trigger, name string) bool {
			return t.Spec.Bucket == name
		}))).
		Watches(&servingv1.Service{}, handler.EnqueueRequestsFromMapFunc(r.referencing(func(t *v1alpha1.Trigger, name string) bool {
			return slices.Contains(r.functions(t), name)
		}))).
		Named("trigger").
		Complete(r)
}

// referencing maps a changed object to the triggers of its namespace that
// refer to it by name.
func (r *TriggerReconciler) referencing(refers func(*v1alpha1.Trigger, string) bool) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		var list v1alpha1.TriggerList
		if err := r.List(ctx, &list, client.InNamespace(obj.GetNamespace())); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		for i := range list.Items {
			if refers(&list.Items[i], obj.GetName()) {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
		}
		return reqs
	}
}
