package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// The counters only go up (a new leader's restored counts may lag what the
// old one wrote), lastFiredTime to the second the API keeps, and an
// unchanged count is no write.
func TestRaiseCounts(t *testing.T) {
	fired := time.Date(2026, 11, 24, 6, 0, 0, 700_000_000, time.UTC)
	ft := metav1.NewTime(fired)
	st := v1alpha1.TriggerStatus{Firings: 5, Reexecutions: 1}
	if !raiseCounts(&st, v1alpha1.TriggerStatus{Firings: 7, Reexecutions: 0, SpeculativeCopies: 2, LastFiredTime: &ft}) {
		t.Fatal("higher counts: no change")
	}
	if st.Firings != 7 || st.Reexecutions != 1 || st.SpeculativeCopies != 2 || !st.LastFiredTime.Time.Equal(fired.Truncate(time.Second)) {
		t.Fatalf("%+v", st)
	}
	// As read back from the API server: the same counts are no change.
	if raiseCounts(&st, v1alpha1.TriggerStatus{Firings: 7, Reexecutions: 1, SpeculativeCopies: 2, LastFiredTime: &ft}) {
		t.Errorf("the same counts changed %+v", st)
	}
	if raiseCounts(&st, v1alpha1.TriggerStatus{Firings: 3}) || st.Firings != 7 {
		t.Errorf("a lower count lowered the status: %+v", st)
	}
}

func TestTriggerWritesRateLimit(t *testing.T) {
	var w triggerWrites
	key := types.NamespacedName{Namespace: "ns", Name: "wf-t"}
	now := time.Now()
	if ok, _ := w.due(key, now, 5*time.Second); !ok {
		t.Fatal("a trigger never written is not due")
	}
	w.wrote(key, now)
	if ok, after := w.due(key, now.Add(2*time.Second), 5*time.Second); ok || after != 3*time.Second {
		t.Errorf("2 s after a write: due %v, after %v; want not before 3 s more", ok, after)
	}
	if ok, _ := w.due(key, now.Add(5*time.Second), 5*time.Second); !ok {
		t.Error("5 s after a write: not due")
	}
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wf"},
		Spec: v1alpha1.WorkflowSpec{Triggers: []v1alpha1.NamedTrigger{{Name: "t"}}}}
	r := &WorkflowReconciler{}
	r.triggerWrites.wrote(key, now)
	r.forgetTriggerWrites(wf)
	if len(r.triggerWrites.last) != 0 {
		t.Errorf("a deleted workflow's triggers are remembered: %v", r.triggerWrites.last)
	}
}

// The workflow ignores status-only updates of its Triggers (its own
// counter patches, the Trigger reconciler's conditions), not the others.
func TestChildSpecChanged(t *testing.T) {
	old := &v1alpha1.Trigger{ObjectMeta: metav1.ObjectMeta{Name: "t", Generation: 1, ResourceVersion: "1", Labels: map[string]string{"a": "b"}}}
	statusOnly := old.DeepCopy()
	statusOnly.ResourceVersion = "2"
	statusOnly.Status.Firings = 4
	if childSpecChanged.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: statusOnly}) {
		t.Error("a status-only update passes")
	}
	spec := statusOnly.DeepCopy()
	spec.Generation = 2
	relabel := statusOnly.DeepCopy()
	relabel.Labels = nil
	for name, n := range map[string]*v1alpha1.Trigger{"spec": spec, "labels": relabel} {
		if !childSpecChanged.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: n}) {
			t.Errorf("a %s change is dropped", name)
		}
	}
}
