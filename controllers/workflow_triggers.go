package controllers

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// DefaultTriggerStatusInterval is the least time between two writes of one
// child Trigger's counters (firings, reexecutions, speculativeCopies,
// lastFiredTime): a trigger firing thousands of times a second costs the
// API server one status patch per interval.
const DefaultTriggerStatusInterval = 5 * time.Second

// triggerWrites remembers when each child Trigger's counters were last
// written, for the rate limit.
type triggerWrites struct {
	mu   sync.Mutex
	last map[types.NamespacedName]time.Time
}

// due reports whether a trigger's counters may be written now, or else
// how long until they may.
func (w *triggerWrites) due(key types.NamespacedName, now time.Time, interval time.Duration) (bool, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if last, ok := w.last[key]; ok && now.Sub(last) < interval {
		return false, interval - now.Sub(last)
	}
	return true, 0
}

func (w *triggerWrites) wrote(key types.NamespacedName, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = map[types.NamespacedName]time.Time{}
	}
	w.last[key] = now
}

// forgetTriggerWrites drops the write times of a deleted workflow's
// triggers.
func (r *WorkflowReconciler) forgetTriggerWrites(wf *v1alpha1.Workflow) {
	triggers, _ := wf.Spec.CompiledTriggers()
	w := &r.triggerWrites
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range triggers {
		delete(w.last, types.NamespacedName{Namespace: wf.Namespace, Name: ChildName(wf.Name, t.Name)})
	}
}

// updateTriggerCounts writes the engine's counts of a workflow's triggers
// (WorkflowSink.TriggerCounts) to the status of its child Triggers, each
// at most once per TriggerStatusInterval. It returns how long until a
// count held back by that limit may be written (0: none is).
//
// Only the counters are patched (a merge patch of the fields that
// changed): the Trigger reconciler owns the rest of the status
// (conditions, observedGeneration) and patches only those, so neither
// overwrites the other. A counter never goes down: a new leader restores
// the counts from the last checkpoint, which may be up to a checkpoint
// interval older than what the old leader wrote.
func (r *WorkflowReconciler) updateTriggerCounts(ctx context.Context, wf *v1alpha1.Workflow) time.Duration {
	counts := r.Sink.TriggerCounts(wf.Namespace, wf.Name)
	interval := r.TriggerStatusInterval
	if interval <= 0 {
		interval = DefaultTriggerStatusInterval
	}
	var wait time.Duration
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		c := counts[name]
		key := types.NamespacedName{Namespace: wf.Namespace, Name: ChildName(wf.Name, name)}
		t := &v1alpha1.Trigger{}
		if err := r.Get(ctx, key, t); err != nil {
			if !apierrors.IsNotFound(err) {
				log.FromContext(ctx).Error(err, "read trigger for its counts", "trigger", key.Name)
			}
			continue
		}
		if !metav1.IsControlledBy(t, wf) {
			continue // not this workflow's child (a name conflict)
		}
		before := t.DeepCopy()
		if !raiseCounts(&t.Status, c) {
			continue
		}
		now := time.Now()
		if ok, after := r.triggerWrites.due(key, now, interval); !ok {
			if wait == 0 || after < wait {
				wait = after
			}
			continue
		}
		if err := r.Status().Patch(ctx, t, client.MergeFrom(before)); err != nil {
			if !apierrors.IsNotFound(err) {
				log.FromContext(ctx).Error(err, "patch trigger counts", "trigger", key.Name)
				if wait == 0 || interval < wait {
					wait = interval
				}
			}
			continue
		}
		r.triggerWrites.wrote(key, now)
	}
	return wait
}

// raiseCounts sets a status's counters to the engine's counts where those
// are higher (lastFiredTime to the second, as the API stores it), and
// reports whether anything changed.
func raiseCounts(st *v1alpha1.TriggerStatus, c v1alpha1.TriggerStatus) bool {
	changed := false
	raise := func(have *int64, want int64) {
		if want > *have {
			*have, changed = want, true
		}
	}
	raise(&st.Firings, c.Firings)
	raise(&st.Reexecutions, c.Reexecutions)
	raise(&st.SpeculativeCopies, c.SpeculativeCopies)
	if c.LastFiredTime != nil {
		fired := metav1.NewTime(c.LastFiredTime.Truncate(time.Second))
		if st.LastFiredTime == nil || st.LastFiredTime.Before(&fired) {
			st.LastFiredTime, changed = &fired, true
		}
	}
	return changed
}

// childSpecChanged passes the updates of a child that may need repair —
// spec (generation), labels, annotations, owners, finalizers, deletion —
// and drops those of its status alone: the workflow reads no child
// Trigger's status, and the counters it writes there (and the Trigger
// reconciler's conditions) would otherwise each cost it a reconcile.
var childSpecChanged = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	o, n := e.ObjectOld, e.ObjectNew
	if o == nil || n == nil {
		return true
	}
	return o.GetGeneration() != n.GetGeneration() ||
		!maps.Equal(o.GetLabels(), n.GetLabels()) ||
		!maps.Equal(o.GetAnnotations(), n.GetAnnotations()) ||
		!equality.Semantic.DeepEqual(o.GetOwnerReferences(), n.GetOwnerReferences()) ||
		!slices.Equal(o.GetFinalizers(), n.GetFinalizers()) ||
		!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp())
}}
