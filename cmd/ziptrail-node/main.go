// Command ziptrail-node is the local cluster's Kubernetes node agent: it
// registers one or more Nodes with the API server and runs the Pods bound to
// them as Linux namespaces (see internal/localcluster/nodeagent and docs/local-cluster.md).
//
//	ziptrail-node --kubeconfig <path> --state-dir <dir> --catalog <images.yaml> \
//	    --node zt-node-0=10.217.0.0/24,zt-node-1=10.217.1.0/24 \
//	    --net-prefix zt --cluster-dns 10.0.0.10 --cluster-domain cluster.local \
//	    --listen-address 127.0.0.1 [--cleanup]
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/sandbox"
)

func main() {
	sandbox.MaybeRunInit() // the in-sandbox re-exec; never returns when it is one
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "ziptrail-node: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg nodeagent.Config
	var nodes string
	var cleanup bool
	fs := flag.NewFlagSet("ziptrail-node", flag.ContinueOnError)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "directory for pod sandboxes (volumes, logs) and built images")
	fs.StringVar(&cfg.CatalogPath, "catalog", "config/local/images.yaml", "image catalog (see docs/local-cluster.md)")
	fs.StringVar(&nodes, "node", "", "nodes to register: <name>=<podCIDR>[,<name>=<podCIDR>...]")
	fs.StringVar(&cfg.NetPrefix, "net-prefix", "zt", "1-5 characters; node i uses bridge <prefix><i>br0 and namespaces <prefix><i>-<pod UID>")
	fs.StringVar(&cfg.ClusterDNS, "cluster-dns", "", "nameserver written into pods' resolv.conf (dnsPolicy ClusterFirst)")
	fs.StringVar(&cfg.ClusterDomain, "cluster-domain", "cluster.local", "cluster DNS domain")
	fs.StringVar(&cfg.ListenAddress, "listen-address", "127.0.0.1", "address of the agent's /healthz endpoint (each node's kubelet API listens on its InternalIP, the gateway of its bridge)")
	fs.IntVar(&cfg.HealthzPort, "healthz-port", 10248, "port of /healthz on --listen-address (200 once every node is Ready)")
	fs.IntVar(&cfg.KubeletPort, "kubelet-port", 10250, "kubelet API port on each node's InternalIP")
	fs.StringVar(&cfg.ClientCAFile, "client-ca-file", "", "CA of the API server's kubelet client certificate; enables webhook authn/authz of the kubelet API (anonymous access without it)")
	fs.DurationVar(&cfg.ShutdownGracePeriod, "shutdown-grace-period", 10*time.Second, "longest grace period given to pods stopped because the agent exits")
	fs.BoolVar(&cleanup, "cleanup", false, "remove every namespace, bridge, mount and process of this prefix left by a crashed run, then exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	var err error
	if cfg.Nodes, err = nodeagent.ParseNodes(nodes); err != nil {
		return err
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if cleanup {
		return nodeagent.Cleanup(ctx, cfg)
	}
	if cfg.Kubeconfig == "" {
		return fmt.Errorf("--kubeconfig is required")
	}
	err = nodeagent.Run(ctx, cfg)
	cfg.Log.Info("stopped")
	return err
}
