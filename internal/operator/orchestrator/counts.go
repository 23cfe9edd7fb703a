package orchestrator

import (
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/engine"
)

// triggerCount is what the orchestrator counted for one trigger of a
// workflow since the workflow was loaded: the numbers a child Trigger's
// status shows. It is part of the checkpoint (state.Triggers), so a new
// leader continues the counts instead of starting them over at 0.
type triggerCount struct {
	// Firings: how often the trigger fired (once per firing, however
	// many targets it invokes).
	Firings int64 `json:"firings,omitempty"`
	// Reexecutions: re-invocations of a source function its rules sent,
	// speculative copies included (as ziptrail_engine_reexecutions_total).
	Reexecutions int64 `json:"reexecutions,omitempty"`
	// SpeculativeCopies: the re-executions that were speculative copies of
	// stragglers (as ziptrail_engine_speculative_copies_total).
	SpeculativeCopies int64 `json:"speculativeCopies,omitempty"`
	// LastFired: when it last fired.
	LastFired time.Time `json:"lastFired,omitzero"`
}

// triggerCounts holds the counts of every loaded workflow's triggers, by
// workflow key (Key) and the trigger's name inside the workflow.
type triggerCounts struct {
	mu sync.Mutex
	m  map[string]map[string]*triggerCount
	// first is each workflow trigger's first target: a firing invokes
	// every target of the trigger once, in the order of the spec, so a
	// firing is counted at the invocation of its first target (the engine
	// reports invocations, not firings). A spec update that reorders the
	// targets while a firing's invocations are being executed could
	// miscount that one firing.
	first map[string]map[string]string
}

func newTriggerCounts() *triggerCounts {
	return &triggerCounts{m: map[string]map[string]*triggerCount{}, first: map[string]map[string]string{}}
}

// setWorkflow records a workflow's triggers. The counts of the triggers it
// still declares carry on; those of triggers it no longer declares go (a
// trigger declared again later starts over, as its new child Trigger does).
func (c *triggerCounts) setWorkflow(spec engine.WorkflowSpec) {
	first := make(map[string]string, len(spec.Triggers))
	for _, t := range spec.Triggers {
		if len(t.Targets) > 0 {
			first[t.Name] = t.Targets[0]
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.first[spec.Name] = first
	for name := range c.m[spec.Name] {
		if _, ok := first[name]; !ok {
			delete(c.m[spec.Name], name)
		}
	}
}

// removeWorkflow forgets a deleted workflow's counts.
func (c *triggerCounts) removeWorkflow(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
	delete(c.first, key)
}

// get returns the count of a trigger, creating it; c.mu must be held.
func (c *triggerCounts) get(workflow, trigger string) *triggerCount {
	wf := c.m[workflow]
	if wf == nil {
		wf = map[string]*triggerCount{}
		c.m[workflow] = wf
	}
	tc := wf[trigger]
	if tc == nil {
		tc = &triggerCount{}
		wf[trigger] = tc
	}
	return tc
}

// invoked counts an ActInvoke: a firing if it invokes the first target of
// its trigger (an entry invocation has no trigger and counts nowhere).
func (c *triggerCounts) invoked(a engine.Action, now time.Time) {
	if a.Trigger == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if first, ok := c.first[a.Workflow][a.Trigger]; !ok || first != a.Function {
		return
	}
	tc := c.get(a.Workflow, a.Trigger)
	tc.Firings++
	tc.LastFired = now
}

// rerun counts an ActRerun sent to its function.
func (c *triggerCounts) rerun(a engine.Action) {
	if a.Trigger == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	tc := c.get(a.Workflow, a.Trigger)
	tc.Reexecutions++
	if a.Speculative {
		tc.SpeculativeCopies++
	}
}

// export copies every count, for a checkpoint.
func (c *triggerCounts) export() map[string]map[string]triggerCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]map[string]triggerCount, len(c.m))
	for wf, ts := range c.m {
		if len(ts) == 0 {
			continue
		}
		m := make(map[string]triggerCount, len(ts))
		for name, tc := range ts {
			m[name] = *tc
		}
		out[wf] = m
	}
	return out
}

// restore replaces every count with a checkpoint's (which may have none:
// a checkpoint written before the counts were kept).
func (c *triggerCounts) restore(st map[string]map[string]triggerCount) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = make(map[string]map[string]*triggerCount, len(st))
	for wf, ts := range st {
		m := make(map[string]*triggerCount, len(ts))
		for name, tc := range ts {
			m[name] = &tc
		}
		c.m[wf] = m
	}
}

// TriggerCounts implements the Workflow reconciler's trigger counter: for
// each trigger of a workflow (by its name inside the workflow) that fired
// or re-executed, the counters of its child Trigger's status — Firings,
// Reexecutions, SpeculativeCopies, LastFiredTime; nothing else is set.
// Triggers that did neither are absent.
func (o *Orchestrator) TriggerCounts(namespace, name string) map[string]v1alpha1.TriggerStatus {
	o.counts.mu.Lock()
	defer o.counts.mu.Unlock()
	ts := o.counts.m[Key(namespace, name)]
	out := make(map[string]v1alpha1.TriggerStatus, len(ts))
	for trig, tc := range ts {
		st := v1alpha1.TriggerStatus{Firings: tc.Firings, Reexecutions: tc.Reexecutions, SpeculativeCopies: tc.SpeculativeCopies}
		if !tc.LastFired.IsZero() {
			t := metav1.NewTime(tc.LastFired)
			st.LastFiredTime = &t
		}
		out[trig] = st
	}
	return out
}
