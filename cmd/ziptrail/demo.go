package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/ziptrail/ziptrail/internal/controlplane"
)

// runDemo is the README's main job until the local serving runtime lands: a
// real API server with the CRDs, the samples applied through kubectl exactly
// as a user would, and kubectl get showing them.
func runDemo(ctx context.Context, out io.Writer) error {
	step := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }
	start := time.Now()

	step("starting kube-apiserver + etcd with the ziptrail and Knative Serving CRDs")
	env, err := controlplane.Start()
	if err != nil {
		return err
	}
	defer func() {
		step("stopping the control plane")
		if err := env.Stop(); err != nil {
			fmt.Fprintf(out, "warning: stop control plane: %v\n", err)
		}
	}()
	step("control plane up in %s", time.Since(start).Round(time.Millisecond))

	dir, err := os.MkdirTemp("", "ziptrail-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	kubeconfig, err := env.Kubeconfig(dir)
	if err != nil {
		return err
	}
	kubectl := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	run := func(args ...string) error {
		cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("kubectl %v: %w", args, err)
		}
		return nil
	}
	samples := filepath.Join(controlplane.RepoRoot(), "config", "samples")
	step("kubectl create namespace demo")
	if err := run("create", "namespace", "demo"); err != nil {
		return err
	}
	step("kubectl apply -f %s", samples)
	if err := run("apply", "-n", "demo", "-f", samples); err != nil {
		return err
	}
	step("kubectl get buckets,triggers,workflows")
	if err := run("get", "-n", "demo", "buckets,triggers,workflows"); err != nil {
		return err
	}
	step("an invalid Trigger is rejected with a field-level message:")
	bad := filepath.Join(dir, "bad-trigger.yaml")
	if err := os.WriteFile(bad, []byte(badTrigger), 0o600); err != nil {
		return err
	}
	if err := run("apply", "-n", "demo", "-f", bad); err == nil {
		return fmt.Errorf("the API server accepted an invalid Trigger")
	}
	step("demo finished in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

const badTrigger = `apiVersion: ziptrail.dev/v1alpha1
kind: Trigger
metadata:
  name: broken
spec:
  bucket: events
  primitive: Redundant
  redundant: {k: 5, outOf: 3}
  targets: [vote]
`
