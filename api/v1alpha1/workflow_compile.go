package v1alpha1

import "strconv"

// DependencyBucket is the bucket a compiled dependency's sources write to.
func DependencyBucket(i int) string { return "dep-" + strconv.Itoa(i) }

// DependencyGroupKey is the metadata entry the fan-in trigger of a Direct
// dependency with several sources groups by. Return values carry no such
// entry, so all of them form one group.
const DependencyGroupKey = "ziptrail.dev/dependency"

// ReturnKey is the key of a function's return value in its dependency
// buckets: the function's name and the invocation that returned it (a
// re-execution's value replaces its original's), so that every invocation's
// value is an object of its own — a Periodic dependency passes every
// period's values, a Direct one every output of a source invoked many times.
func ReturnKey(function, invocation string) string { return function + "." + invocation }

// CompiledTriggers returns the workflow's triggers: the inline ones plus one
// per function-oriented dependency (Pheromone Appendix A.4), and the buckets
// the compiled ones need. Each dependency gets its own bucket, which its
// source functions' return values go to (keyed by ReturnKey): a Direct
// dependency with one source fires Immediate, once per return value; with
// several it is a fan-in that waits for all of them — a DynamicGroup over
// the sources, firing once with every return value when all their
// invocations have finished; a Periodic one is ByTime.
func (s *WorkflowSpec) CompiledTriggers() ([]NamedTrigger, []string) {
	triggers := append([]NamedTrigger(nil), s.Triggers...)
	var buckets []string
	for i, d := range s.Dependencies {
		name := DependencyBucket(i)
		buckets = append(buckets, name)
		spec := TriggerSpec{Bucket: name, Targets: append([]string(nil), d.To...)}
		switch {
		case d.Type == DependencyPeriodic && d.Period != nil:
			spec.Primitive = ByTime
			spec.ByTime = &ByTimeParams{Window: *d.Period}
		case len(d.From) > 1:
			spec.Primitive = DynamicGroup
			spec.DynamicGroup = &DynamicGroupParams{GroupMetadataKey: DependencyGroupKey, Sources: append([]string(nil), d.From...)}
		default:
			spec.Primitive = Immediate
		}
		triggers = append(triggers, NamedTrigger{Name: name, Spec: spec})
	}
	return triggers, buckets
}

// OutputBuckets maps each function to the buckets its return value goes
// to: the dependency buckets it feeds, and for a sink of the function
// graph (a function nothing depends on, or the entry of a one-function
// workflow) the output bucket, so its return value is the session result.
func (s *WorkflowSpec) OutputBuckets() map[string][]string {
	out := map[string][]string{}
	if len(s.Dependencies) == 0 {
		if len(s.Triggers) == 0 {
			out[s.Entry] = []string{s.Output()}
		}
		return out
	}
	feeds := map[string]bool{}
	for i, d := range s.Dependencies {
		for _, f := range d.From {
			out[f] = append(out[f], DependencyBucket(i))
			feeds[f] = true
		}
	}
	for _, d := range s.Dependencies {
		for _, f := range d.To {
			if !feeds[f] && len(out[f]) == 0 {
				out[f] = []string{s.Output()}
			}
		}
	}
	return out
}

// Output is the workflow's output bucket, "output" by default.
func (s *WorkflowSpec) Output() string {
	if s.OutputBucket == "" {
		return "output"
	}
	return s.OutputBucket
}
