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
