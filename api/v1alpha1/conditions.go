package v1alpha1

// Condition types shared by all ziptrail kinds. Ready summarises the others,
// following the Knative convention of one top-level condition.
const (
	// ConditionReady is True when the object is fully reconciled and usable.
	ConditionReady = "Ready"
	// ConditionBucketResolved is True when a Trigger's bucket exists.
	ConditionBucketResolved = "BucketResolved"
	// ConditionTargetsResolved is True when every target function of a Trigger exists.
	ConditionTargetsResolved = "TargetsResolved"
	// ConditionServicesReady is True when every Knative Service of a Workflow is ready.
	ConditionServicesReady = "ServicesReady"
	// ConditionTiersReady is True when a Bucket's spill and persist tiers are configured.
	ConditionTiersReady = "TiersReady"
)

// Condition reasons. They are CamelCase so they read well in kubectl describe.
const (
	ReasonReconciled         = "Reconciled"
	ReasonBucketNotFound     = "BucketNotFound"
	ReasonTargetNotFound     = "TargetNotFound"
	ReasonServiceNotReady    = "ServiceNotReady"
	ReasonServicesReady      = "ServicesReady"
	ReasonTierNotConfigured  = "TierNotConfigured"
	ReasonTiersConfigured    = "TiersConfigured"
	ReasonInvalidSpec        = "InvalidSpec"
	ReasonChildConflict      = "ChildConflict"
	ReasonDependenciesFailed = "DependenciesNotReady"
	// ReasonDoesNotFit: a function's pods need more memory (the objects
	// volume sized from the buckets, and the container's request) than
	// any schedulable node allocates.
	ReasonDoesNotFit = "DoesNotFit"
)

// Labels and annotations ziptrail puts on the objects it manages.
const (
	// LabelWorkflow names the Workflow that owns an object.
	LabelWorkflow = "ziptrail.dev/workflow"
	// LabelFunction names the workflow function a Knative Service runs.
	LabelFunction = "ziptrail.dev/function"
	// AnnotationBuckets lists, on a revision template, the buckets a
	// function may write to with their memory limits, for queue-proxy-zl.
	AnnotationBuckets = "ziptrail.dev/buckets"
	// AnnotationMemoryLimit is the pod's object-store memory cap in bytes
	// (a decimal integer), on a revision template, for queue-proxy-zl.
	AnnotationMemoryLimit = "ziptrail.dev/memory-limit"
	// The Workflow controller writes these on every function's revision
	// template; Knative mounts the revision's annotations into queue-proxy
	// (config-features queueproxy.mount-podinfo: enabled) at
	// /etc/podinfo/annotations, which queue-proxy-zl reads at startup.
	// None of them is a secret: tier endpoints and credentials come over
	// the authenticated control stream instead.
	//
	// AnnotationWorkflow and AnnotationFunction name the workflow and the
	// workflow function the pod runs.
	AnnotationWorkflow = "ziptrail.dev/workflow"
	AnnotationFunction = "ziptrail.dev/function"
	// AnnotationObjectTTL is the lifetime of an object nobody read (a Go
	// duration, e.g. "10m0s").
	AnnotationObjectTTL = "ziptrail.dev/object-ttl"
	// AnnotationInlineThreshold is the size in bytes (a decimal integer) up
	// to which objects travel inline.
	AnnotationInlineThreshold = "ziptrail.dev/inline-threshold"
	// AnnotationControlAddr is the operator's control Service (host:port).
	AnnotationControlAddr = "ziptrail.dev/control-addr"

	// AnnotationObjectsVolume is the size in bytes (a decimal integer) of
	// the memory-backed volume a function pod keeps its objects in, on a
	// revision template, for the operator's pod webhook: it mounts an
	// emptyDir (medium Memory, this sizeLimit) at ObjectsDir in every
	// container of the pod, queue-proxy-zl's included (Knative gives
	// queue-proxy no volumes of the template), and adds the size to the
	// containers' memory (internal/operator/podwebhook). Without the webhook the
	// pod's containers share the pod's /dev/shm instead (64 MiB on
	// containerd and CRI-O).
	AnnotationObjectsVolume = "ziptrail.dev/objects-volume"
	// ObjectsDir is where a function pod's containers share its objects and
	// the sidecar's local-API socket.
	ObjectsDir = "/dev/shm/ziptrail"
	// DefaultMemoryLimitPerPod is the object-store cap of a pod whose
	// buckets set no memoryLimitPerPod (queue-proxy-zl's default,
	// ZIPTRAIL_MEMORY_LIMIT).
	DefaultMemoryLimitPerPod = 256 << 20
)
