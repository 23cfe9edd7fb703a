package app

import (
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ziptrail/ziptrail/internal/operator/podwebhook"
)

// The pod webhook in the operator binary (every replica serves it, not
// only the leader: admission must not wait for an election): the objects
// volume of function pods (podwebhook.ObjectsPath) and the same-node
// directory (podwebhook.Path; the chart registers it with sameNode
// enabled).

// setupPodWebhook registers the webhook on the manager (its server
// starts with the manager, on every replica).
func setupPodWebhook(mgr ctrl.Manager, c PodWebhookConfig) error {
	if c.Port == 0 {
		return nil
	}
	// The manager's default webhook server, configured here: it is only
	// created once something asks for it.
	srv := webhook.NewServer(webhook.Options{Port: c.Port, CertDir: c.CertDir})
	srv.Register(podwebhook.Path, &webhook.Admission{Handler: &podwebhook.Mutator{HostDir: c.HostDir}})
	srv.Register(podwebhook.ObjectsPath, &webhook.Admission{Handler: podwebhook.ObjectsMutator{}})
	return mgr.Add(srv)
}
