package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// childConflictError means a child's name is taken by an object the
// workflow does not own; overwriting it would clobber someone else's work.
type childConflictError struct{ kind, name string }

func (e *childConflictError) Error() string {
	return fmt.Sprintf("%s %q already exists and is not owned by this workflow; rename the function/bucket/trigger or delete that object", e.kind, e.name)
}

// applyChildren creates or updates every desired child and deletes the
// children the spec no longer declares.
func (r *WorkflowReconciler) applyChildren(ctx context.Context, wf *v1alpha1.Workflow, want *children) error {
	keep := map[string]bool{}
	for _, s := range want.services {
		keep["Service/"+s.Name] = true
		if err := r.applyOne(ctx, wf, "Service", s, &servingv1.Service{}, func(got client.Object) bool {
			g := got.(*servingv1.Service)
			if equality.Semantic.DeepDerivative(s.Spec, g.Spec) && labelsContain(g.Labels, s.Labels) {
				return false
			}
			g.Spec = s.Spec
			g.Labels = mergeLabels(g.Labels, s.Labels)
			return true
		}); err != nil {
			return err
		}
	}
	for _, b := range want.buckets {
		keep["Bucket/"+b.Name] = true
		if err := r.applyOne(ctx, wf, "Bucket", b, &v1alpha1.Bucket{}, func(got client.Object) bool {
			g := got.(*v1alpha1.Bucket)
			if equality.Semantic.DeepDerivative(b.Spec, g.Spec) && labelsContain(g.Labels, b.Labels) {
				return false
			}
			g.Spec = b.Spec
			g.Labels = mergeLabels(g.Labels, b.Labels)
			return true
		}); err != nil {
			return err
		}
	}
	for _, t := range want.triggers {
		keep["Trigger/"+t.Name] = true
		if err := r.applyOne(ctx, wf, "Trigger", t, &v1alpha1.Trigger{}, func(got client.Object) bool {
			g := got.(*v1alpha1.Trigger)
			if equality.Semantic.DeepDerivative(t.Spec, g.Spec) && labelsContain(g.Labels, t.Labels) {
				return false
			}
			g.Spec = t.Spec
			g.Labels = mergeLabels(g.Labels, t.Labels)
			return true
		}); err != nil {
			return err
		}
	}
	return r.prune(ctx, wf, keep)
}

// applyOne creates want, or updates the existing object through mutate when
// it is ours and differs.
func (r *WorkflowReconciler) applyOne(ctx context.Context, wf *v1alpha1.Workflow, kind string, want, got client.Object, mutate func(client.Object) bool) error {
	err := r.Get(ctx, client.ObjectKeyFromObject(want), got)
	switch {
	case apierrors.IsNotFound(err):
		if err := controllerutil.SetControllerReference(wf, want, r.Scheme()); err != nil {
			return err
		}
		if err := r.Create(ctx, want); err != nil {
			return fmt.Errorf("create %s %s: %w", kind, want.GetName(), err)
		}
		r.Recorder.Eventf(wf, want, "Normal", "Created", "Create", "created %s %s", kind, want.GetName())
		return nil
	case err != nil:
		return err
	}
	if !metav1.IsControlledBy(got, wf) {
		return &childConflictError{kind: kind, name: want.GetName()}
	}
	if !mutate(got) {
		return nil
	}
	if err := r.Update(ctx, got); err != nil {
		return fmt.Errorf("update %s %s: %w", kind, want.GetName(), err)
	}
	r.Recorder.Eventf(wf, got, "Normal", "Updated", "Update", "updated %s %s", kind, want.GetName())
	return nil
}

// prune deletes the owned children whose names are not in keep.
func (r *WorkflowReconciler) prune(ctx context.Context, wf *v1alpha1.Workflow, keep map[string]bool) error {
	_, err := r.deleteOwned(ctx, wf, keep)
	return err
}

// deleteOwned deletes the children controlled by wf that are not in keep
// (nil keep: all of them) and returns how many it deleted.
func (r *WorkflowReconciler) deleteOwned(ctx context.Context, wf *v1alpha1.Workflow, keep map[string]bool) (int, error) {
	sel := []client.ListOption{client.InNamespace(wf.Namespace), client.MatchingLabels{v1alpha1.LabelWorkflow: wf.Name}}
	var objs []client.Object
	var svcs servingv1.ServiceList
	if err := r.List(ctx, &svcs, sel...); err != nil {
		return 0, err
	}
	for i := range svcs.Items {
		objs = append(objs, &svcs.Items[i])
	}
	var buckets v1alpha1.BucketList
	if err := r.List(ctx, &buckets, sel...); err != nil {
		return 0, err
	}
	for i := range buckets.Items {
		objs = append(objs, &buckets.Items[i])
	}
	var triggers v1alpha1.TriggerList
	if err := r.List(ctx, &triggers, sel...); err != nil {
		return 0, err
	}
	for i := range triggers.Items {
		objs = append(objs, &triggers.Items[i])
	}
	deleted := 0
	for _, o := range objs {
		kind := kindOf(o)
		if keep[kind+"/"+o.GetName()] || !metav1.IsControlledBy(o, wf) {
			continue
		}
		deleted++
		if err := r.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			return deleted, fmt.Errorf("delete %s %s: %w", kind, o.GetName(), err)
		}
		r.Recorder.Eventf(wf, o, "Normal", "Deleted", "Delete", "deleted %s %s", kind, o.GetName())
	}
	return deleted, nil
}

func kindOf(o client.Object) string {
	switch o.(type) {
	case *servingv1.Service:
		return "Service"
	case *v1alpha1.Bucket:
		return "Bucket"
	case *v1alpha1.Trigger:
		return "Trigger"
	}
	return fmt.Sprintf("%T", o)
}

func labelsContain(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func mergeLabels(have, want map[string]string) map[string]string {
	if have == nil {
		have = map[string]string{}
	}
	for k, v := range want {
		have[k] = v
	}
	return have
}
