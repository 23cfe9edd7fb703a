package app

import (
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// clientOptions: Secrets are read straight from the API server, not from
// the manager's cache. A cached read would start a cluster-wide Secret
// informer, which needs list and watch on every Secret of the cluster; the
// operator only gets and creates the per-namespace reference-key Secrets
// (ClusterRole: get, create, update on secrets). Installed by the chart,
// the leader logged `secrets is forbidden: … cannot list resource
// "secrets"` as soon as a sidecar asked for its namespace's keys.
func clientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}}
}
