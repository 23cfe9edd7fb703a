package engine

import (
	"fmt"
	"time"
)

// Object is an object that became ready in a bucket.
type Object struct {
	Bucket  string `json:"bucket"`
	Key     string `json:"key"`
	Session string `json:"session"`
	Size    int64  `json:"size,omitempty"`
	Ref     string `json:"ref,omitempty"`
	// Inline is omitted when nil only: an empty object ("inline": "") is
	// an object, and one restored from a checkpoint without contents
	// could not be passed on (omitzero, not omitempty, and no
	// MarshalJSON: a marshaler's output is compacted again at every
	// level, which was two thirds of a checkpoint's encoding).
	Inline     []byte            `json:"inline,omitzero"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Producer   string            `json:"producer,omitempty"`   // producing function
	Invocation string            `json:"invocation,omitempty"` // producing invocation id
	// FiredLocally are the invocations the producer's sidecar says it made
	// for this object itself (delegated firing, see Delegable): ids of
	// DelegatedInvocation. The engine records those firings without
	// asking for them to be sent; it ignores any other id, and every
	// claim from another workflow or for an object without a producing
	// invocation.
	FiredLocally []string `json:"-"`
}

// Metadata keys the built-in primitives read.
const (
	// MetaExpectedKeys declares, for DynamicJoin, the comma-separated keys
	// the join waits for.
	MetaExpectedKeys = "ziptrail.expected-keys"
	// MetaExpectedCount declares, for DynamicJoin, how many objects the join
	// waits for.
	MetaExpectedCount = "ziptrail.expected-count"
	// MetaDeclareOnly marks an object that only declares the expected set
	// and is not itself a member.
	MetaDeclareOnly = "ziptrail.declare-only"
)

// ActionKind is what the caller must do.
type ActionKind string

const (
	ActInvoke          ActionKind = "Invoke"          // invoke Function with Objects
	ActRerun           ActionKind = "Rerun"           // re-invoke a late source Function with its original Args
	ActSessionComplete ActionKind = "SessionComplete" // Result is the output object
	ActSessionExpired  ActionKind = "SessionExpired"  // the deadline passed first
	ActSessionFailed   ActionKind = "SessionFailed"   // Reason says why; nothing more runs
	ActDropObjects     ActionKind = "DropObjects"     // free every object of Session
)

// Action is one decision of the engine.
type Action struct {
	Kind       ActionKind `json:"kind"`
	Workflow   string     `json:"workflow"`
	Session    string     `json:"session"`
	Function   string     `json:"function,omitempty"`
	Trigger    string     `json:"trigger,omitempty"`
	Invocation string     `json:"invocation,omitempty"` // id the invoked function reports back
	Objects    []Object   `json:"objects,omitempty"`
	Args       []byte     `json:"args,omitempty"`
	Group      string     `json:"group,omitempty"`
	Attempt    int        `json:"attempt,omitempty"`
	Result     *Object    `json:"result,omitempty"`
	Reason     string     `json:"reason,omitempty"` // why a session failed
	// Invocations, on ActSessionComplete, is how many invocations the
	// session had (each once, its re-executions not counted again),
	// delegated firings included: one whose claim had not reached the
	// engine when the session's output did (the consumer's start had)
	// counts too.
	Invocations int `json:"invocations,omitempty"`
	// Speculative marks an ActRerun that is a speculative copy of a
	// straggler (RerunRule.SpeculateAfter), not a re-execution of a late
	// or failed invocation: the original still runs, the first to finish
	// wins.
	Speculative bool `json:"speculative,omitempty"`
	// Delegated marks an ActInvoke the producer's sidecar already made
	// (it reported so, or the invocation reported its start): the caller
	// records it as sent and does not send it again.
	Delegated bool `json:"delegated,omitempty"`
	// Limit names the limit that ended the session of an
	// ActSessionFailed (LimitObjectsPerSession, ...; limits.go); empty
	// for every other failure.
	Limit string `json:"limit,omitempty"`
}

// Finish is how an invocation ended.
type Finish struct {
	Failed bool
	Error  string // what went wrong, for the session's failure reason
	// Outputs is how many distinct objects (bucket/key) the invocation
	// sent, by every path: the engine treats it as still running until it
	// has counted them all, so that an output reported late (through a
	// sidecar, after the response) is not missed. Zero: none to wait for.
	Outputs int
}

func (a Action) String() string {
	return fmt.Sprintf("%s %s/%s fn=%s trig=%s inv=%s objs=%d", a.Kind, a.Workflow, a.Session, a.Function, a.Trigger, a.Invocation, len(a.Objects))
}

// Kind names a built-in primitive.
type Kind string

const (
	Immediate    Kind = "Immediate"
	ByName       Kind = "ByName"
	BySet        Kind = "BySet"
	ByBatchSize  Kind = "ByBatchSize"
	ByTime       Kind = "ByTime"
	Redundant    Kind = "Redundant"
	DynamicJoin  Kind = "DynamicJoin"
	DynamicGroup Kind = "DynamicGroup"
)

// Scope of a re-execution rule.
type Scope string

const (
	PerObject  Scope = "PerObject"  // each source invocation must produce output in time
	PerSession Scope = "PerSession" // some output of the source must arrive in time
)

// RerunRule re-invokes SourceFunction when its output has not reached the
// trigger's bucket within Timeout, at most MaxAttempts times.
//
// With SpeculateAfter x (0 < x < 1; 0: off; PerObject only) it also
// launches speculative copies of stragglers (Locus §3.5): the rule's
// invocations of SourceFunction form waves — a wave opens when one starts
// while none of the rule's earlier ones is outstanding, every invocation
// that starts while it is open joins it, and it closes when none of its
// members is outstanding (output arrived, or the rule gave up) — so the
// invocations dispatched together (a stage's mappers, a DynamicGroup's
// reducers) are one wave, and the next stage's another. Once a fraction x
// of a wave's members have sent their output to the trigger's bucket,
// every member still outstanding gets one copy (same arguments), as an
// ActRerun with Speculative set, counted against MaxAttempts. The original
// keeps running; whichever finishes first wins: the invocation counts as
// finished then, and the other's outputs (same keys) are dropped as
// duplicates.
type RerunRule struct {
	SourceFunction string        `json:"sourceFunction"`
	Scope          Scope         `json:"scope"`
	Timeout        time.Duration `json:"timeout"`
	MaxAttempts    int           `json:"maxAttempts"`
	SpeculateAfter float64       `json:"speculateAfter,omitempty"`
}

// TriggerSpec configures one trigger.
type TriggerSpec struct {
	Name      string   `json:"name"`
	Bucket    string   `json:"bucket"`
	Primitive Kind     `json:"primitive"`
	Targets   []string `json:"targets"`

	Key              string        `json:"key,omitempty"`              // ByName
	Keys             []string      `json:"keys,omitempty"`             // BySet
	BatchSize        int           `json:"batchSize,omitempty"`        // ByBatchSize
	Window           time.Duration `json:"window,omitempty"`           // ByTime
	K                int           `json:"k,omitempty"`                // Redundant
	N                int           `json:"n,omitempty"`                // Redundant
	GroupMetadataKey string        `json:"groupMetadataKey,omitempty"` // DynamicGroup
	Sources          []string      `json:"sources,omitempty"`          // DynamicGroup, DynamicJoin

	Reruns []RerunRule `json:"reruns,omitempty"`
}

// WorkflowSpec is everything the engine knows about one workflow.
type WorkflowSpec struct {
	Name            string        `json:"name"` // unique key, e.g. namespace/name
	Entry           string        `json:"entry"`
	OutputBucket    string        `json:"outputBucket"`
	SessionDeadline time.Duration `json:"sessionDeadline"`
	Triggers        []TriggerSpec `json:"triggers"`
	// Delegate gives the firings of delegable triggers (Delegable) ids
	// derived from session, trigger, target and object
	// (DelegatedInvocation), so the producer's sidecar may make them
	// itself; false: sequential ids, every firing sent by the caller.
	Delegate bool `json:"delegate,omitempty"`
}

// Validate reports the first problem in a spec.
func (w *WorkflowSpec) Validate() error {
	if w.Name == "" || w.Entry == "" || w.OutputBucket == "" {
		return fmt.Errorf("workflow %q: name, entry and outputBucket are required", w.Name)
	}
	if w.SessionDeadline <= 0 {
		return fmt.Errorf("workflow %s: sessionDeadline must be positive", w.Name)
	}
	seen := map[string]bool{}
	for _, t := range w.Triggers {
		if seen[t.Name] {
			return fmt.Errorf("workflow %s: trigger %q defined twice", w.Name, t.Name)
		}
		seen[t.Name] = true
		if _, err := newPrimitive(t); err != nil {
			return fmt.Errorf("workflow %s: trigger %s: %w", w.Name, t.Name, err)
		}
		for _, r := range t.Reruns {
			if r.SourceFunction == "" || r.Timeout <= 0 || r.MaxAttempts < 1 {
				return fmt.Errorf("workflow %s: trigger %s: re-execution rules need a source function, a positive timeout and maxAttempts >= 1", w.Name, t.Name)
			}
			if r.SpeculateAfter < 0 || r.SpeculateAfter >= 1 {
				return fmt.Errorf("workflow %s: trigger %s: re-execution rule for %s: speculateAfter %v is not a fraction in (0, 1) (0: no speculation)", w.Name, t.Name, r.SourceFunction, r.SpeculateAfter)
			}
			if r.SpeculateAfter > 0 && r.Scope == PerSession {
				return fmt.Errorf("workflow %s: trigger %s: re-execution rule for %s: speculative copies need scope PerObject (a wave's members finish one by one)", w.Name, t.Name, r.SourceFunction)
			}
		}
	}
	return nil
}
