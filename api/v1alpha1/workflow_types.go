package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// FunctionSpec is one function of a Workflow, deployed as a Knative Service
// named <workflow>-<function>.
// +kubebuilder:validation:XValidation:rule="has(self.image) || has(self.template)",message="a function needs an image or a template"
type FunctionSpec struct {
	// Name of the function, unique in the Workflow; a DNS label of at most
	// 28 characters so that <workflow>-<function> is a valid Service name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=28
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Image is the user container image (shortcut for a one-container template).
	// +optional
	Image string `json:"image,omitempty"`
	// Command of the user container: replaces the image's entrypoint, as a
	// container's command does. Not run in a shell.
	// +listType=atomic
	// +optional
	Command []string `json:"command,omitempty"`
	// Args of the user container: replace the image's default arguments
	// (its CMD), as a container's args do; with Command, they follow it.
	// +listType=atomic
	// +optional
	Args []string `json:"args,omitempty"`
	// Env for the user container.
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`
	// Resources of the user container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// ContainerConcurrency bounds concurrent requests per pod (0 = unlimited).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	ContainerConcurrency *int64 `json:"containerConcurrency,omitempty"`
	// MinScale and MaxScale bound Knative's autoscaler.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinScale *int32 `json:"minScale,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxScale *int32 `json:"maxScale,omitempty"`

	// Template is a full Knative RevisionTemplateSpec
	// (serving.knative.dev/v1); when set it is used as the base and Image,
	// Command, Args, Env and Resources are applied on top of its first
	// container (each, when set, replaces the container's field; Env
	// variables replace those of the same name). Validated by Knative.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +optional
	Template *runtime.RawExtension `json:"template,omitempty"`
}

// NamedBucket is a Bucket declared inline in a Workflow.
type NamedBucket struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// +kubebuilder:default={}
	// +optional
	Spec BucketSpec `json:"spec,omitempty"`
}

// NamedTrigger is a Trigger declared inline in a Workflow.
type NamedTrigger struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string      `json:"name"`
	Spec TriggerSpec `json:"spec"`
}

// DependencyType is the kind of a function-oriented dependency.
// +kubebuilder:validation:Enum=Direct;Periodic
type DependencyType string

const (
	// DependencyDirect invokes the targets with each output of the sources
	// (all sources' outputs when there are several: a fan-in).
	DependencyDirect DependencyType = "Direct"
	// DependencyPeriodic invokes the targets every Period with the outputs
	// accumulated since the last invocation.
	DependencyPeriodic DependencyType = "Periodic"
)

// Dependency is the function-oriented form (Pheromone Appendix A.4): the
// operator compiles each dependency into a bucket and a trigger.
// +kubebuilder:validation:XValidation:rule="self.type != 'Periodic' || has(self.period)",message="period is required for a Periodic dependency",fieldPath=".period"
// +kubebuilder:validation:XValidation:rule="self.type != 'Direct' || !has(self.period)",message="period is only valid for a Periodic dependency",fieldPath=".period"
type Dependency struct {
	// From are the source functions.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	From []string `json:"from"`
	// To are the target functions.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	To []string `json:"to"`
	// Type is Direct (default) or Periodic.
	// +kubebuilder:default=Direct
	// +optional
	Type DependencyType `json:"type,omitempty"`
	// Period of a Periodic dependency.
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="period must be positive"
	// +optional
	Period *metav1.Duration `json:"period,omitempty"`
}

// WorkflowSpec declares a workflow's functions and how data flows between them:
// either data-centric (buckets and triggers) or function-oriented
// (dependencies), or both.
// +kubebuilder:validation:XValidation:rule="self.functions.exists(f, f.name == self.entry)",message="entry must name one of the functions",fieldPath=".entry"
// +kubebuilder:validation:XValidation:rule="has(self.triggers) || has(self.dependencies) || size(self.functions) == 1",message="a workflow with several functions needs triggers or dependencies"
type WorkflowSpec struct {
	// Functions of the workflow.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=map
	// +listMapKey=name
	Functions []FunctionSpec `json:"functions"`

	// Entry is the function a new session invokes with its input.
	// +kubebuilder:validation:MinLength=1
	Entry string `json:"entry"`

	// OutputBucket receives the session's result; an object there completes
	// the session. Defaults to "output" when omitted.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	OutputBucket string `json:"outputBucket,omitempty"`

	// Buckets owned by the workflow.
	// +kubebuilder:validation:MaxItems=256
	// +listType=map
	// +listMapKey=name
	// +optional
	Buckets []NamedBucket `json:"buckets,omitempty"`

	// Triggers owned by the workflow.
	// +kubebuilder:validation:MaxItems=256
	// +listType=map
	// +listMapKey=name
	// +optional
	Triggers []NamedTrigger `json:"triggers,omitempty"`

	// Dependencies in the function-oriented form.
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	// +optional
	Dependencies []Dependency `json:"dependencies,omitempty"`

	// SessionDeadline expires a session that has not completed in time; its
	// objects are then garbage-collected.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="sessionDeadline must be positive"
	// +optional
	SessionDeadline *metav1.Duration `json:"sessionDeadline,omitempty"`
}

// SessionCounts summarises a Workflow's sessions.
type SessionCounts struct {
	// +optional
	Active int64 `json:"active,omitempty"`
	// +optional
	Completed int64 `json:"completed,omitempty"`
	// +optional
	Failed int64 `json:"failed,omitempty"`
	// +optional
	Expired int64 `json:"expired,omitempty"`
	// LastFailure is the most recent failed session and why it failed.
	// +optional
	LastFailure *SessionFailure `json:"lastFailure,omitempty"`
}

// SessionFailure is a failed session and the reason it failed.
type SessionFailure struct {
	// Session is the session's id (see `ziptrail sessions`).
	Session string `json:"session"`
	// Reason names what failed and why, e.g. the function, its error and
	// that no re-execution rule covers it; at most 1 KiB.
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason"`
	// Time is when the session failed.
	Time metav1.Time `json:"time"`
}

// WorkflowStatus is the observed state of a Workflow.
type WorkflowStatus struct {
	// ObservedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, ServicesReady, TargetsResolved.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Sessions counts sessions by state.
	// +optional
	Sessions SessionCounts `json:"sessions,omitempty"`
	// Functions is the number of functions deployed.
	// +optional
	Functions int32 `json:"functions,omitempty"`
	// Engine is where the workflow's trigger engine runs when the engine
	// is sharded across operator replicas (docs/sharding.md); absent with
	// a single unsharded engine.
	// +optional
	Engine *WorkflowEngine `json:"engine,omitempty"`
}

// WorkflowEngine names the engine bucket a workflow hashes to and the
// operator replica that owns that bucket.
type WorkflowEngine struct {
	// Bucket is the bucket's name (also its Lease's).
	Bucket string `json:"bucket"`
	// Owner is the identity (pod IP) of the replica holding the bucket.
	Owner string `json:"owner"`
}

// Workflow owns a set of functions (one Knative Service each) and the Buckets
// and Triggers that connect them.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=zw,categories=ziptrail
// +kubebuilder:printcolumn:name="Entry",type=string,JSONPath=`.spec.entry`
// +kubebuilder:printcolumn:name="Functions",type=integer,JSONPath=`.status.functions`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.sessions.active`
// +kubebuilder:printcolumn:name="Completed",type=integer,JSONPath=`.status.sessions.completed`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.sessions.failed`,priority=1
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.status.engine.owner`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 28",message="metadata.name must be a DNS label of at most 28 characters, so that <workflow>-<function> is a valid Knative Service name"
type Workflow struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WorkflowSpec   `json:"spec"`
	Status WorkflowStatus `json:"status,omitempty"`
}

// WorkflowList is a list of Workflows.
// +kubebuilder:object:root=true
type WorkflowList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Workflow `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Workflow{}, &WorkflowList{})
}
