package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
)

// runLocal implements `ziptrail local up|down|status`.
func runLocal(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: ziptrail local up|down|status [flags]")
	}
	fs := flag.NewFlagSet("local "+args[0], flag.ContinueOnError)
	stateDir := fs.String("state-dir", defaultStateDir(), "directory for the kubeconfig and logs")
	nodes := fs.Int("nodes", 1, "nodes of the local Kubernetes cluster (ziptrail-node, the node agent, registers them)")
	noOperator := fs.Bool("no-operator", false, "run Kubernetes, Knative Serving and the storage tiers only, and install ziptrail with `helm install` (the command is printed), as on any cluster")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "up":
		t := time.Now()
		c, err := localcluster.Up(ctx, localcluster.Options{StateDir: *stateDir, Nodes: *nodes, NoOperator: *noOperator, Log: out})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "==> local cluster up in %s\n", time.Since(t).Round(time.Millisecond))
		if *noOperator {
			fmt.Fprintf(out, "\nlocal cluster is up: Kubernetes, Knative Serving %s (ingress %s, Host: <service>.<namespace>.%s), "+
				"redis-server and MinIO.\nIn another terminal, from this directory:\n  export KUBECONFIG=%s\n"+
				"  helm install ziptrail charts/ziptrail --namespace %s --create-namespace --wait",
				c.Knative.Version, c.IngressURL, c.Knative.Domain, c.Kubeconfig, localcluster.SystemNamespace)
			for _, v := range c.HelmValues() {
				fmt.Fprintf(out, " \\\n      --set %s", v)
			}
			fmt.Fprintf(out, "\n  kubectl create namespace demo\n  kubectl -n demo apply -f examples/wordcount/workflow.yaml\n"+
				"  kubectl -n %s get service ziptrail-gateway   # the session gateway, at its ClusterIP:8088\nPress Ctrl-C to stop.\n", localcluster.SystemNamespace)
		} else {
			fmt.Fprintf(out, "\nlocal cluster is up: Kubernetes, Knative Serving %s (ingress %s, Host: <service>.<namespace>.%s), "+
				"ziptrail's operator (session gateway %s).\nIn another terminal, from this directory:\n"+
				"  export KUBECONFIG=%s\n  kubectl create namespace demo\n  kubectl -n demo apply -f examples/wordcount/workflow.yaml\n"+
				"  ziptrail run -n demo wordcount --input LICENSE\n  ziptrail sessions -n demo\nPress Ctrl-C to stop.\n",
				c.Knative.Version, c.IngressURL, c.Knative.Domain, c.GatewayURL, c.Kubeconfig)
		}
		<-ctx.Done()
		fmt.Fprintln(out, "==> stopping the local cluster")
		return c.Down(context.Background())
	case "down":
		// Removes what a crashed `local up` may have left behind.
		if st, err := k8s.ReadState(*stateDir); err == nil {
			if pid := st.Owner; st.OwnerAlive() {
				// An orderly stop first: `local up` stops on SIGTERM.
				fmt.Fprintf(out, "==> asking `local up` (pid %d) to stop\n", pid)
				_ = syscall.Kill(pid, syscall.SIGTERM)
				for i := 0; i < 600 && st.OwnerAlive(); i++ {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
		fmt.Fprintln(out, "==> stopping Kubernetes components, node agent pods, kube-proxy rules")
		if _, err := k8s.Down(ctx, *stateDir); err != nil {
			return err
		}
		localcluster.KillLeftovers(*stateDir)
		fmt.Fprintln(out, "removed the cluster's processes, pods and network, and the storage tier servers")
		return nil
	case "status":
		return k8sStatus(ctx, *stateDir, out)
	}
	return fmt.Errorf("unknown local command %q (want up, down or status)", args[0])
}

func defaultStateDir() string {
	cache := os.Getenv("ZIPTRAIL_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "ziptrail")
	}
	return filepath.Join(cache, "local")
}

// k8sStatus prints the health of each component of the local Kubernetes
// cluster recorded in stateDir, and each node's Ready condition.
func k8sStatus(ctx context.Context, stateDir string, out io.Writer) error {
	hs, err := k8s.Status(ctx, stateDir)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(out, "no local Kubernetes cluster recorded in %s\n", stateDir)
		return nil
	}
	if err != nil && len(hs) == 0 {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "COMPONENT\tPID\tHEALTH\tLOG")
	for _, h := range hs {
		health := "ok"
		if h.Err != nil {
			health = h.Err.Error()
		}
		pid := "-"
		if h.PID > 0 {
			pid = strconv.Itoa(h.PID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.Name, pid, health, h.Log)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err != nil {
		fmt.Fprintf(out, "nodes: %v\n", err)
	}
	return nil
}
