// Package v1alpha1 contains the ziptrail.dev/v1alpha1 API: Buckets that hold a
// workflow's intermediate objects, Triggers that decide when those objects
// invoke the next functions, and Workflows that own both plus the functions.
//
// +kubebuilder:object:generate=true
// +groupName=ziptrail.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every ziptrail kind.
	GroupVersion = schema.GroupVersion{Group: "ziptrail.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the ziptrail kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the ziptrail kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
