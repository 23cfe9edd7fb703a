// Package activatorext is the ziptrail layer of activator-ext, Knative's
// activator composed with ziptrail-aware behaviour (cmd/activator-ext):
//
//   - Handler reads a request's ziptrail headers and, while the request waits
//     in the activator for a destination (typically a cold start), keeps the
//     referenced objects alive at their producers through a KeepAliver, so
//     the request does not fail because an object expired meanwhile.
//   - LocalityThrottler wraps the activator's throttler: among the ready pods
//     of the target revision it prefers one on the node of the producer of
//     the request's largest referenced object, and keeps Knative's choice
//     otherwise. That node comes in the Ziptrail-Producer-Node header, set
//     by the operator's dispatcher (internal/operator/dispatch): the orchestrator
//     remembers, for each reference a sidecar reports over its control
//     stream (ObjectReady), the node of the reporting pod, which is the
//     node the API server signed into that pod's service-account token
//     (TokenReview's authentication.kubernetes.io/node-name; only on an API
//     server older than 1.30, the node the sidecar's Hello names, a hint).
//     The header is a preference, never a trust decision: a request
//     without it, or naming a node with no ready pod, goes where Knative
//     sends it.
//
// The package depends on Kubernetes types (the throttler's revision id,
// Endpoints) but not on Knative's: cmd/activator-ext adapts Knative's
// handler context, informers and throttler to the small interfaces here.
package activatorext

import (
	"net/http"
	"strings"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Headers set by ziptrail's dispatcher on invocations.
const (
	// HeaderRefs carries the invocation's object references, comma separated.
	HeaderRefs = invocation.HeaderRefs
	// HeaderProducerNode names the node of the pod that produced the
	// invocation's largest referenced object whose producer the operator
	// knows; absent when it knows none.
	HeaderProducerNode = invocation.HeaderProducerNode
)

// MaxRefs bounds the references one request keeps alive (a header is user
// input; the keep-alive work per request must stay bounded).
const MaxRefs = 256

// ParseRefs returns the distinct, non-empty references of a request's
// Ziptrail-Refs header(s), at most MaxRefs, in order of appearance.
func ParseRefs(h http.Header) []string {
	var refs []string
	seen := map[string]bool{}
	for _, v := range h.Values(HeaderRefs) {
		for _, r := range strings.Split(v, ",") {
			r = strings.TrimSpace(r)
			if r == "" || seen[r] {
				continue
			}
			if len(refs) == MaxRefs {
				return refs
			}
			seen[r] = true
			refs = append(refs, r)
		}
	}
	return refs
}

// ProducerNode returns the request's producer node, "" when absent.
func ProducerNode(h http.Header) string {
	return strings.TrimSpace(h.Get(HeaderProducerNode))
}
