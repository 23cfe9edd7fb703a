// Package kingress is ziptrail's implementation of Knative's networking layer
// (KIngress) for the local cluster, where there is no Envoy: it does for
// Knative what net-kourier does, with a Go reverse proxy as the gateway.
//
// The controller (Reconciler) watches networking.internal.knative.dev
// Ingresses of the class ClassName through Knative's generated reconciler,
// translates each one (after ingress.InsertProbe) into immutable per-ingress
// routes (Translate), merges them into one route Table per visibility and
// swaps that into the proxies atomically. Every ExternalIP rule is served on
// the external listener and on the cluster-local one; ClusterLocal rules only
// on the cluster-local listener.
//
// The data path (Proxy) routes by Host and longest path prefix, honours the
// exact header matches (Knative-Serving-Tag, K-Network-Hash), picks a split by
// its percent, overwrites the rule's and the split's appendHeaders, applies
// rewriteHost and forwards to a ready endpoint of the backend Service, read
// from its EndpointSlices (not its ClusterIP, so kube-proxy is not needed).
// A refused connection is retried on another endpoint before anything of the
// request is sent. Bodies stream in both directions; upgrades (websockets)
// pass through; backends whose Service port is named http2 or h2c get h2c.
//
// An Ingress becomes Ready only once both listeners serve its current spec:
// Knative's status.Prober sends K-Network-Probe requests through this
// process's own listeners (selfTargetLister) and waits for the backend to
// echo the hash of that spec.
package kingress
