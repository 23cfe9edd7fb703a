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
	"strings"

	"github.com/ziptrail/ziptrail/internal/controlplane"
	"github.com/ziptrail/ziptrail/internal/localcluster"
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
		c, err := localcluster.Up(ctx, localcluster.Options{StateDir: *stateDir, QueueProxy: qp, Instances: *instances, Log: out})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\nlocal cluster is up (session gateway %s). In another terminal, from this directory:\n"+
			"  export KUBECONFIG=%s\n  kubectl apply -f examples/wordcount/workflow.yaml\n"+
			"  ziptrail run wordcount --input LICENSE\n  ziptrail sessions\nPress Ctrl-C to stop.\n", c.GatewayURL, c.Kubeconfig)
		<-ctx.Done()
		fmt.Fprintln(out, "==> stopping the local cluster")
		return c.Down(context.Background())
	case "down":
		// Removes what a crashed `local up` may have left behind.
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
			fmt.Fprintln(out, "no local cluster pods are running")
			return nil
		}
		fmt.Fprintf(out, "%d pods: %s\nkubeconfig: %s\n", len(pods), strings.Join(pods, " "), filepath.Join(*stateDir, "kubeconfig"))
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
