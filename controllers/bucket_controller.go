package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// Tiers says which storage tiers this operator installation has endpoints for.
type Tiers struct {
	Redis bool
	S3    bool
	// ControlAddr is the operator's control Service (host:port, e.g.
	// ziptrail-control.ziptrail-system.svc:9443). The Workflow controller
	// writes it on every function's revision template
	// (v1alpha1.AnnotationControlAddr) for queue-proxy-zl; empty writes
	// none (the sidecar then runs without an operator).
	ControlAddr string
}

func (t Tiers) has(tier v1alpha1.Tier) bool {
	switch tier {
	case v1alpha1.TierRedis:
		return t.Redis
	case v1alpha1.TierS3:
		return t.S3
	}
	return false
}

// BucketReconciler checks that a Bucket's tiers are available and reports it.
type BucketReconciler struct {
	client.Client
	Recorder events.EventRecorder
	Tiers    Tiers
}

// +kubebuilder:rbac:groups=ziptrail.dev,resources=buckets,verbs=get;list;watch
// +kubebuilder:rbac:groups=ziptrail.dev,resources=buckets/status,verbs=get;update;patch

// Reconcile sets TiersReady and Ready on a Bucket.
func (r *BucketReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	b := &v1alpha1.Bucket{}
	if err := r.Get(ctx, req.NamespacedName, b); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := b.DeepCopy()
	wasReady := readyStatus(b.Status.Conditions)
	defer func() {
		b.Status.ObservedGeneration = b.Generation
		if err := r.Status().Patch(ctx, b, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
			reterr = errors.Join(reterr, fmt.Errorf("patch bucket status: %w", err))
		}
		if now := readyStatus(b.Status.Conditions); now != wasReady && now == metav1.ConditionFalse {
			r.Recorder.Eventf(b, nil, corev1.EventTypeWarning, "NotReady", "Reconcile", "%s", readyMessage(b.Status.Conditions))
		}
	}()

	var problems []string
	// Quantities inside a Workflow cannot be range-checked by CEL (cost
	// budget), so the operator checks them for every Bucket.
	if q := b.Spec.MemoryLimitPerPod; q != nil && q.Sign() <= 0 {
		problems = append(problems, "memoryLimitPerPod must be positive")
	}
	if q := b.Spec.InlineThreshold; q != nil && q.Sign() < 0 {
		problems = append(problems, "inlineThreshold must not be negative")
	}
	if len(problems) > 0 {
		setCondition(&b.Status.Conditions, b.Generation, v1alpha1.ConditionTiersReady, false, v1alpha1.ReasonInvalidSpec, strings.Join(problems, "; "))
		setReady(&b.Status.Conditions, b.Generation, v1alpha1.ConditionTiersReady)
		return ctrl.Result{}, nil
	}
	var missing []string
	for _, t := range b.Spec.SpillTiers {
		if !r.Tiers.has(t) {
			missing = append(missing, fmt.Sprintf("spill tier %s", t))
		}
	}
	if b.Spec.PersistTier != "" && !r.Tiers.has(b.Spec.PersistTier) {
		missing = append(missing, fmt.Sprintf("persist tier %s", b.Spec.PersistTier))
	}
	if len(missing) > 0 {
		setCondition(&b.Status.Conditions, b.Generation, v1alpha1.ConditionTiersReady, false, v1alpha1.ReasonTierNotConfigured,
			fmt.Sprintf("the operator has no endpoint for %s (set --redis-addr / --s3-endpoint or the chart's tiers values)", strings.Join(missing, ", ")))
	} else {
		setCondition(&b.Status.Conditions, b.Generation, v1alpha1.ConditionTiersReady, true, v1alpha1.ReasonTiersConfigured, "")
	}
	setReady(&b.Status.Conditions, b.Generation, v1alpha1.ConditionTiersReady)
	return ctrl.Result{}, nil
}

// SetupWithManager watches Buckets.
func (r *BucketReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1alpha1.Bucket{}).Named("bucket").Complete(r)
}
