package orchestrator

import (
	"time"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/engine"
)

// Key names a workflow inside the engine.
func Key(namespace, name string) string { return namespace + "/" + name }

// engineSpec translates a Workflow into the engine's terms. The engine works
// with the workflow's own names (functions, buckets); the dispatcher maps a
// function to its Knative Service when it sends the invocation.
func engineSpec(wf *v1alpha1.Workflow) engine.WorkflowSpec {
	spec := engine.WorkflowSpec{
		Name:            Key(wf.Namespace, wf.Name),
		Entry:           wf.Spec.Entry,
		OutputBucket:    wf.Spec.Output(),
		SessionDeadline: 10 * time.Minute,
	}
	if wf.Spec.SessionDeadline != nil {
		spec.SessionDeadline = wf.Spec.SessionDeadline.Duration
	}
	triggers, _ := wf.Spec.CompiledTriggers()
	for _, t := range triggers {
		spec.Triggers = append(spec.Triggers, engineTrigger(t.Name, t.Spec))
	}
	return spec
}

func engineTrigger(name string, t v1alpha1.TriggerSpec) engine.TriggerSpec {
	out := engine.TriggerSpec{Name: name, Bucket: t.Bucket, Primitive: engine.Kind(t.Primitive), Targets: append([]string(nil), t.Targets...)}
	switch {
	case t.ByName != nil:
		out.Key = t.ByName.Key
	case t.BySet != nil:
		out.Keys = append([]string(nil), t.BySet.Keys...)
	case t.ByBatchSize != nil:
		out.BatchSize = int(t.ByBatchSize.Size)
	case t.ByTime != nil:
		out.Window = t.ByTime.Window.Duration
	case t.Redundant != nil:
		out.K, out.N = int(t.Redundant.K), int(t.Redundant.N)
	case t.DynamicJoin != nil:
		out.Sources = append([]string(nil), t.DynamicJoin.Sources...)
	case t.DynamicGroup != nil:
		out.GroupMetadataKey = t.DynamicGroup.GroupMetadataKey
		out.Sources = append([]string(nil), t.DynamicGroup.Sources...)
	}
	for _, r := range t.Reexecution {
		scope := engine.PerObject
		if r.Scope == v1alpha1.RerunPerSession {
			scope = engine.PerSession
		}
		attempts := int(r.MaxAttempts)
		if attempts == 0 {
			attempts = 3
		}
		rule := engine.RerunRule{SourceFunction: r.SourceFunction, Scope: scope, Timeout: r.Timeout.Duration, MaxAttempts: attempts}
		if r.SpeculateAfter != nil {
			rule.SpeculateAfter = float64(*r.SpeculateAfter) / 100 // a percentage in the API, a fraction in the engine
		}
		out.Reruns = append(out.Reruns, rule)
	}
	return out
}
