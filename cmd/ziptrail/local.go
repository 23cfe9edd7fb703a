package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ziptrail/ziptrail/internal/controlplane"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/localk8s"
	"github.com/ziptrail/ziptrail/internal/netns"
)

// runLocal implements `ziptrail local up|down|status`.
func runLocal(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: ziptrail local up|down|status [flags]")
	}
	fs := flag.NewFlagSet("local "+args[0], flag.ContinueOnError)
	stateDir := fs.String("state-dir", defaultStateDir(), "directory for the kubeconfig and logs")
	queueProxy := fs.String("queue-proxy", "", "queue-proxy binary for every pod (default: build ./cmd/queue-proxy-zl)")
	instances := fs.Int("instances", 1, "pods per function")
	nodes := fs.Int("nodes", 2, "nodes of the full Kubernetes cluster (controller-manager, scheduler, kube-proxy, CoreDNS, node agent); 0: only kube-apiserver + etcd")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "up":
		qp := *queueProxy
		if qp == "" {
			var err error
			if qp, err = buildQueueProxy(ctx, *stateDir, out); err != nil {
				return err
			}
		}
		opts := localcluster.Options{StateDir: *stateDir, QueueProxy: qp, Instances: *instances, Log: out}
		if *nodes > 0 {
			agent, err := buildNodeAgent(ctx, *stateDir, out)
			if err != nil {
				return err
			}
			opts.Kubernetes = &localk8s.Options{Nodes: *nodes, NodeAgent: agent}
		}
		t := time.Now()
		c, err := localcluster.Up(ctx, opts)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "==> local cluster up in %s\n", time.Since(t).Round(time.Millisecond))
		fmt.Fprintf(out, "\nlocal cluster is up (session gateway %s). In another terminal, from this directory:\n"+
			"  export KUBECONFIG=%s\n  kubectl apply -f examples/wordcount/workflow.yaml\n"+
			"  ziptrail run wordcount --input LICENSE\n  ziptrail sessions\nPress Ctrl-C to stop.\n", c.GatewayURL, c.Kubeconfig)
		<-ctx.Done()
		fmt.Fprintln(out, "==> stopping the local cluster")
		return c.Down(context.Background())
	case "down":
		// Removes what a crashed `local up` may have left behind.
		if st, err := localk8s.ReadState(*stateDir); err == nil {
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
		if _, err := localk8s.Down(ctx, *stateDir); err != nil {
			return err
		}
		n, err := netns.New("zt", netip.MustParsePrefix("10.213.0.0/24"))
		if err != nil {
			return err
		}
		if err := n.Cleanup(ctx); err != nil {
			return err
		}
		localcluster.KillLeftovers(*stateDir)
		fmt.Fprintln(out, "removed leftover pod namespaces, the zt bridge and the storage tier servers")
		return os.RemoveAll(filepath.Join("/dev/shm", "ziptrail-zt"))
	case "status":
		if err := k8sStatus(ctx, *stateDir, out); err != nil {
			return err
		}
		out2, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
		if err != nil {
			return err
		}
		var pods []string
		for _, line := range strings.Split(string(out2), "\n") {
			if strings.HasPrefix(line, "zt-") {
				pods = append(pods, strings.Fields(line)[0])
			}
		}
		if len(pods) == 0 {
			fmt.Fprintln(out, "no ziptrail function pods (local serving runtime) are running")
			return nil
		}
		fmt.Fprintf(out, "%d function pods (local serving runtime): %s\nkubeconfig: %s\n", len(pods), strings.Join(pods, " "), filepath.Join(*stateDir, "kubeconfig"))
		return nil
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

// buildQueueProxy builds the queue-proxy every local pod runs: the
// repository's queue-proxy-zl, or Knative's stock queue-proxy while this
// tree has none (objects then travel inline, through the invocations).
func buildQueueProxy(ctx context.Context, stateDir string, out io.Writer) (string, error) {
	root := controlplane.RepoRoot()
	pkg, name := "./cmd/queue-proxy-zl", "queue-proxy-zl"
	if _, err := os.Stat(filepath.Join(root, "cmd", "queue-proxy-zl")); err != nil {
		pkg, name = "knative.dev/serving/cmd/queue", "Knative's stock queue-proxy (no cmd/queue-proxy-zl in this tree)"
	}
	bin := filepath.Join(stateDir, "bin", "queue-proxy")
	fmt.Fprintf(out, "==> building %s (first time: a minute or two)\n", name)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, err)
	}
	return bin, nil
}

// k8sStatus prints the health of each component of the local Kubernetes
// cluster recorded in stateDir, and each node's Ready condition.
func k8sStatus(ctx context.Context, stateDir string, out io.Writer) error {
	hs, err := localk8s.Status(ctx, stateDir)
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

// buildNodeAgent builds cmd/ziptrail-node, the node agent of the local
// Kubernetes cluster, into the state directory (go build's cache makes a
// second build quick).
func buildNodeAgent(ctx context.Context, stateDir string, out io.Writer) (string, error) {
	bin := filepath.Join(stateDir, "bin", "ziptrail-node")
	fmt.Fprintln(out, "==> building the node agent ziptrail-node (first time: a minute or two)")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/ziptrail-node")
	cmd.Dir = controlplane.RepoRoot()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build ./cmd/ziptrail-node: %w", err)
	}
	return bin, nil
}
