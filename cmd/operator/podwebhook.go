package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ziptrail/ziptrail/internal/nodedir"
	"github.com/ziptrail/ziptrail/internal/operator/podwebhook"
)

// The pod webhook in the operator binary (every replica serves it, not
// only the leader: admission must not wait for an election): the objects
// volume of function pods (podwebhook.ObjectsPath) and the same-node
// directory (podwebhook.Path; the chart registers it with sameNode
// enabled); and the node-dir command of the same-node DaemonSet.

type podWebhookConfig struct {
	port    int
	certDir string
	hostDir string
}

func podWebhookFlags(c *podWebhookConfig) {
	flag.IntVar(&c.port, "pod-webhook-port", 0, "port of the mutating webhook that gives function pods their objects volume and queue-proxy-zl the same-node directory (docs/samenode.md); 0 disables it")
	flag.StringVar(&c.certDir, "pod-webhook-cert-dir", "/etc/ziptrail/webhook-tls", "directory holding the webhook's tls.crt and tls.key")
	flag.StringVar(&c.hostDir, "pod-webhook-host-dir", podwebhook.DefaultHostDir, "the node directory (hostPath) mounted into queue-proxy")
}

// setupPodWebhook registers the webhook on the manager (its server
// starts with the manager, on every replica).
func setupPodWebhook(mgr ctrl.Manager, c podWebhookConfig) error {
	if c.port == 0 {
		return nil
	}
	// The manager's default webhook server, configured here: it is only
	// created once something asks for it.
	srv := webhook.NewServer(webhook.Options{Port: c.port, CertDir: c.certDir})
	srv.Register(podwebhook.Path, &webhook.Admission{Handler: &podwebhook.Mutator{HostDir: c.hostDir}})
	srv.Register(podwebhook.ObjectsPath, &webhook.Admission{Handler: podwebhook.ObjectsMutator{}})
	return mgr.Add(srv)
}

// exitNodeDir runs `operator node-dir [--path DIR]`: prepare the node
// directory (nodedir.Prepare) and wait for SIGTERM, as the chart's
// DaemonSet's container.
func exitNodeDir() {
	if len(os.Args) < 2 || os.Args[1] != "node-dir" {
		return
	}
	fs := flag.NewFlagSet("node-dir", flag.ExitOnError)
	path := fs.String("path", podwebhook.DefaultHostDir, "the node directory")
	_ = fs.Parse(os.Args[2:])
	if err := nodedir.Prepare(*path); err != nil {
		fmt.Fprintf(os.Stderr, "operator node-dir: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("operator node-dir: %s ready (mode %v)\n", *path, nodedir.Mode)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	os.Exit(0)
}
