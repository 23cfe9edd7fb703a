package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Tier names a storage tier behind the in-pod object store.
// +kubebuilder:validation:Enum=redis;s3
type Tier string

const (
	// TierRedis is the fast tier: objects spill here under memory pressure.
	TierRedis Tier = "redis"
	// TierS3 is the slow tier: backups on pod shutdown and persisted objects.
	TierS3 Tier = "s3"
)

// GCPolicy says when a bucket's objects are freed.
// +kubebuilder:validation:Enum=OnSessionComplete;OnRead;Retain
type GCPolicy string

const (
	// GCOnSessionComplete frees a session's objects once the session completes
	// (or expires). This is the default.
	GCOnSessionComplete GCPolicy = "OnSessionComplete"
	// GCOnRead frees an object as soon as it has been read as often as allowed.
	GCOnRead GCPolicy = "OnRead"
	// GCRetain keeps objects until their TTL expires, for debugging.
	GCRetain GCPolicy = "Retain"
)

// BucketSpec configures where a bucket's objects live and how long.
type BucketSpec struct {
	// MemoryLimitPerPod caps the bytes of this bucket's objects held in one
	// producer pod's memory; a put beyond it spills or waits.
	// +kubebuilder:default="256Mi"
	// +optional
	MemoryLimitPerPod *resource.Quantity `json:"memoryLimitPerPod,omitempty"`

	// ObjectTTL is how long an unread object is kept before it is freed.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="objectTTL must be positive"
	// +optional
	ObjectTTL *metav1.Duration `json:"objectTTL,omitempty"`

	// InlineThreshold is the size up to which an object travels inline in
	// the invocation instead of by reference.
	// +kubebuilder:default="64Ki"
	// +optional
	InlineThreshold *resource.Quantity `json:"inlineThreshold,omitempty"`

	// SpillTiers lists, in order, where objects go when pod memory is full.
	// +kubebuilder:validation:MaxItems=2
	// +listType=set
	// +optional
	SpillTiers []Tier `json:"spillTiers,omitempty"`

	// PersistTier is where objects sent with persist=true are stored durably.
	// +optional
	PersistTier Tier `json:"persistTier,omitempty"`

	// GCPolicy says when objects are freed.
	// +kubebuilder:default=OnSessionComplete
	// +optional
	GCPolicy GCPolicy `json:"gcPolicy,omitempty"`
}

// BucketStatus is the observed state of a Bucket.
type BucketStatus struct {
	// ObservedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, TiersReady.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Objects is the number of objects currently held across pods and tiers.
	// +optional
	Objects int64 `json:"objects,omitempty"`
	// Bytes is the total size of those objects.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
}

// Bucket holds a workflow's intermediate objects. Producers put objects into
// it; its Triggers decide which functions those objects invoke.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=zb,categories=ziptrail
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Memory/Pod",type=string,JSONPath=`.spec.memoryLimitPerPod`
// +kubebuilder:printcolumn:name="TTL",type=string,JSONPath=`.spec.objectTTL`
// +kubebuilder:printcolumn:name="Spill",type=string,JSONPath=`.spec.spillTiers`
// +kubebuilder:printcolumn:name="Objects",type=integer,JSONPath=`.status.objects`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63",message="metadata.name must be a DNS label (lowercase alphanumerics and '-', at most 63 characters)"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.memoryLimitPerPod) || quantity(string(self.spec.memoryLimitPerPod)).isGreaterThan(quantity('0'))",message="memoryLimitPerPod must be positive",fieldPath=".spec.memoryLimitPerPod"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.inlineThreshold) || !quantity(string(self.spec.inlineThreshold)).isLessThan(quantity('0'))",message="inlineThreshold must not be negative",fieldPath=".spec.inlineThreshold"
type Bucket struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:default={}
	// +optional
	Spec   BucketSpec   `json:"spec,omitempty"`
	Status BucketStatus `json:"status,omitempty"`
}

// BucketList is a list of Buckets.
// +kubebuilder:object:root=true
type BucketList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Bucket `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Bucket{}, &BucketList{})
}
