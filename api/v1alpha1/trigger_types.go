package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Primitive is a trigger primitive: the rule that decides when objects in a
// bucket invoke the trigger's target functions (Pheromone, Table 1).
// +kubebuilder:validation:Enum=Immediate;ByName;BySet;ByBatchSize;ByTime;Redundant;DynamicJoin;DynamicGroup
type Primitive string

// The eight built-in primitives.
const (
	Immediate    Primitive = "Immediate"
	ByName       Primitive = "ByName"
	BySet        Primitive = "BySet"
	ByBatchSize  Primitive = "ByBatchSize"
	ByTime       Primitive = "ByTime"
	Redundant    Primitive = "Redundant"
	DynamicJoin  Primitive = "DynamicJoin"
	DynamicGroup Primitive = "DynamicGroup"
)

// ByNameParams fires when an object with the given key arrives.
type ByNameParams struct {
	// Key is the object key that fires the trigger.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key"`
}

// BySetParams fires once per session when every key of a static set is present.
type BySetParams struct {
	// Keys is the set of object keys to wait for.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MinLength=1
	// +listType=set
	Keys []string `json:"keys"`
}

// ByBatchSizeParams fires every Size objects.
type ByBatchSizeParams struct {
	// Size is the number of objects per batch.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Size int32 `json:"size"`
}

// ByTimeParams fires with every object accumulated during a window.
type ByTimeParams struct {
	// Window is the aggregation period, e.g. "500ms" or "1s".
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="window must be positive"
	Window metav1.Duration `json:"window"`
}

// RedundantParams fires once per session when any K of N expected objects
// arrived. The YAML form reads "k: 3, outOf: 5" (a key named "n" would be
// parsed as the boolean false by YAML 1.1 parsers such as kubectl's).
// +kubebuilder:validation:XValidation:rule="self.k <= self.outOf",message="k must not exceed outOf",fieldPath=".k"
type RedundantParams struct {
	// K is how many objects are enough.
	// +kubebuilder:validation:Minimum=1
	K int32 `json:"k"`
	// N is how many objects are expected.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	N int32 `json:"outOf"`
}

// DynamicJoinParams fires when a set of objects declared at run time is complete.
// The producer declares the expected set (via the SDK's expected-set metadata)
// before or with its first object.
type DynamicJoinParams struct {
	// Sources optionally restricts which functions may declare the expected set.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	Sources []string `json:"sources,omitempty"`
}

// DynamicGroupParams groups objects by a metadata value; each group fires its
// targets once all source functions of the session have finished.
type DynamicGroupParams struct {
	// GroupMetadataKey names the object metadata entry holding the group name.
	// +kubebuilder:default=group
	// +kubebuilder:validation:MinLength=1
	// +optional
	GroupMetadataKey string `json:"groupMetadataKey,omitempty"`
	// Sources are the functions whose completion closes the groups.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	Sources []string `json:"sources"`
}

// RerunScope says what a re-execution timeout is measured against.
// +kubebuilder:validation:Enum=PerObject;PerSession
type RerunScope string

const (
	// RerunPerObject re-invokes a source invocation whose own output is late.
	RerunPerObject RerunScope = "PerObject"
	// RerunPerSession re-invokes a source if the session's expected output is late.
	RerunPerSession RerunScope = "PerSession"
)

// ReexecutionRule re-invokes a source function, with its original arguments,
// when its output has not reached the bucket in time (Pheromone §4.4), and,
// with speculateAfter, launches speculative copies of its stragglers
// (Locus §3.5).
// +kubebuilder:validation:XValidation:rule="!has(self.speculateAfter) || !has(self.scope) || self.scope == 'PerObject'",message="speculateAfter needs scope PerObject: a wave's invocations finish one by one",fieldPath=".speculateAfter"
type ReexecutionRule struct {
	// SourceFunction is the function to re-invoke.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	SourceFunction string `json:"sourceFunction"`
	// Scope is PerObject (default) or PerSession.
	// +kubebuilder:default=PerObject
	// +optional
	Scope RerunScope `json:"scope,omitempty"`
	// Timeout after which the output counts as lost.
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="timeout must be positive"
	Timeout metav1.Duration `json:"timeout"`
	// MaxAttempts bounds the re-executions per invocation, speculative
	// copies included.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxAttempts int32 `json:"maxAttempts,omitempty"`
	// SpeculateAfter, a percentage (1 to 99), turns on speculative copies
	// of stragglers (Locus §3.5). The rule's invocations of sourceFunction
	// in a session form waves: a wave opens when one starts while none of
	// the earlier ones is outstanding, and every invocation starting while
	// it is open joins it, so the invocations dispatched together (a
	// stage's mappers, a DynamicGroup's reducers) are one wave; one fired
	// by outputs of the same invocation as the wave's members (the same
	// splitter) joins it even when none is outstanding for a moment. Once
	// speculateAfter percent of a wave's invocations have sent their output
	// to this trigger's bucket, every one still outstanding gets one copy
	// with the same arguments, counted against maxAttempts. The original
	// keeps running; the first to finish wins, and the other's outputs
	// (same keys) are dropped as duplicates. Unset: no copies.
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 99",message="speculateAfter is the percentage of a wave that must have finished, 1 to 99"
	// +optional
	SpeculateAfter *int32 `json:"speculateAfter,omitempty"`
}

// TriggerSpec binds a bucket to target functions through a primitive. Exactly
// the parameter block of the chosen primitive must be set (Immediate has none).
// +kubebuilder:validation:XValidation:rule="self.primitive != 'ByName' || has(self.byName)",message="byName is required when primitive is ByName",fieldPath=".byName"
// +kubebuilder:validation:XValidation:rule="self.primitive != 'BySet' || has(self.bySet)",message="bySet is required when primitive is BySet",fieldPath=".bySet"
// +kubebuilder:validation:XValidation:rule="self.primitive != 'ByBatchSize' || has(self.byBatchSize)",message="byBatchSize is required when primitive is ByBatchSize",fieldPath=".byBatchSize"
// +kubebuilder:validation:XValidation:rule="self.primitive != 'ByTime' || has(self.byTime)",message="byTime is required when primitive is ByTime",fieldPath=".byTime"
// +kubebuilder:validation:XValidation:rule="self.primitive != 'Redundant' || has(self.redundant)",message="redundant is required when primitive is Redundant",fieldPath=".redundant"
// +kubebuilder:validation:XValidation:rule="self.primitive != 'DynamicGroup' || has(self.dynamicGroup)",message="dynamicGroup is required when primitive is DynamicGroup",fieldPath=".dynamicGroup"
// +kubebuilder:validation:XValidation:rule="!has(self.byName) || self.primitive == 'ByName'",message="byName is only valid with primitive ByName",fieldPath=".byName"
// +kubebuilder:validation:XValidation:rule="!has(self.bySet) || self.primitive == 'BySet'",message="bySet is only valid with primitive BySet",fieldPath=".bySet"
// +kubebuilder:validation:XValidation:rule="!has(self.byBatchSize) || self.primitive == 'ByBatchSize'",message="byBatchSize is only valid with primitive ByBatchSize",fieldPath=".byBatchSize"
// +kubebuilder:validation:XValidation:rule="!has(self.byTime) || self.primitive == 'ByTime'",message="byTime is only valid with primitive ByTime",fieldPath=".byTime"
// +kubebuilder:validation:XValidation:rule="!has(self.redundant) || self.primitive == 'Redundant'",message="redundant is only valid with primitive Redundant",fieldPath=".redundant"
// +kubebuilder:validation:XValidation:rule="!has(self.dynamicJoin) || self.primitive == 'DynamicJoin'",message="dynamicJoin is only valid with primitive DynamicJoin",fieldPath=".dynamicJoin"
// +kubebuilder:validation:XValidation:rule="!has(self.dynamicGroup) || self.primitive == 'DynamicGroup'",message="dynamicGroup is only valid with primitive DynamicGroup",fieldPath=".dynamicGroup"
type TriggerSpec struct {
	// Bucket is the name of the Bucket (same namespace) this trigger watches.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Bucket string `json:"bucket"`

	// Primitive decides when the targets fire.
	Primitive Primitive `json:"primitive"`

	// Targets are the functions invoked when the trigger fires: function
	// names inside a Workflow, Knative Service names for a standalone Trigger.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	Targets []string `json:"targets"`

	// +optional
	ByName *ByNameParams `json:"byName,omitempty"`
	// +optional
	BySet *BySetParams `json:"bySet,omitempty"`
	// +optional
	ByBatchSize *ByBatchSizeParams `json:"byBatchSize,omitempty"`
	// +optional
	ByTime *ByTimeParams `json:"byTime,omitempty"`
	// +optional
	Redundant *RedundantParams `json:"redundant,omitempty"`
	// +optional
	DynamicJoin *DynamicJoinParams `json:"dynamicJoin,omitempty"`
	// +optional
	DynamicGroup *DynamicGroupParams `json:"dynamicGroup,omitempty"`

	// Reexecution re-invokes source functions whose output is late.
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=sourceFunction
	// +optional
	Reexecution []ReexecutionRule `json:"reexecution,omitempty"`
}

// TriggerStatus is the observed state of a Trigger.
type TriggerStatus struct {
	// ObservedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, BucketResolved, TargetsResolved.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Firings counts how often the trigger fired (once per firing, however
	// many targets it invokes). Written by the operator for a Workflow's
	// triggers, at most every few seconds; cumulative since the trigger
	// was created.
	// +optional
	Firings int64 `json:"firings,omitempty"`
	// Reexecutions counts source re-invocations caused by this trigger's
	// rules, speculative copies included.
	// +optional
	Reexecutions int64 `json:"reexecutions,omitempty"`
	// SpeculativeCopies counts the re-executions that were speculative
	// copies of stragglers (speculateAfter): a subset of Reexecutions.
	// +optional
	SpeculativeCopies int64 `json:"speculativeCopies,omitempty"`
	// LastFiredTime is when the trigger last fired.
	// +optional
	LastFiredTime *metav1.Time `json:"lastFiredTime,omitempty"`
}

// Trigger invokes target functions when objects in its bucket satisfy its primitive.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=zt,categories=ziptrail
// +kubebuilder:printcolumn:name="Bucket",type=string,JSONPath=`.spec.bucket`
// +kubebuilder:printcolumn:name="Primitive",type=string,JSONPath=`.spec.primitive`
// +kubebuilder:printcolumn:name="Targets",type=string,JSONPath=`.spec.targets`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Firings",type=integer,JSONPath=`.status.firings`
// +kubebuilder:printcolumn:name="Reexecutions",type=integer,JSONPath=`.status.reexecutions`
// +kubebuilder:printcolumn:name="Speculative",type=integer,JSONPath=`.status.speculativeCopies`,priority=1
// +kubebuilder:printcolumn:name="Last Fired",type=date,JSONPath=`.status.lastFiredTime`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63",message="metadata.name must be a DNS label (lowercase alphanumerics and '-', at most 63 characters)"
type Trigger struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TriggerSpec   `json:"spec"`
	Status TriggerStatus `json:"status,omitempty"`
}

// TriggerList is a list of Triggers.
// +kubebuilder:object:root=true
type TriggerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Trigger `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Trigger{}, &TriggerList{})
}
