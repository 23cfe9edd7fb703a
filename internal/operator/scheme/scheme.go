// Package scheme is the operator's Kubernetes scheme: the built-in kinds,
// ziptrail's (api/v1alpha1) and Knative Serving's v1, which the operator
// creates per function. The operator's manager and the tests' control
// plane (internal/tools/envtest) both use it, so they know the same kinds.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// New returns a new scheme with the operator's kinds.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	utilruntime.Must(servingv1.AddToScheme(s))
	return s
}
