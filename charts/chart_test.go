// Package charts_test checks the Helm chart with the real helm binary and
// a real API server: lint, render, and server-side dry-run apply.
package charts_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/operator/podwebhook"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("helm")
	if err != nil {
		t.Fatal("helm not found: run `eval \"$(hack/install-deps.sh --env)\"` (make test does)")
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err = cmd.Run()
	return out.String() + stderr.String(), err
}

func TestChart(t *testing.T) {
	chart := filepath.Join(paths.RepoRoot(), "charts", "ziptrail")
	allFeatures := filepath.Join(chart, "ci", "all-features-values.yaml")

	for _, values := range [][]string{nil, {"-f", allFeatures}} {
		if out, err := helm(t, append([]string{"lint", "--strict", chart}, values...)...); err != nil {
			t.Fatalf("helm lint %v: %v\n%s", values, err, out)
		}
	}
	out, err := helm(t, "lint", chart, "-f", filepath.Join(chart, "ci", "bad-values.yaml"))
	if err == nil {
		t.Errorf("helm lint accepted ci/bad-values.yaml:\n%s", out)
	}
	for _, field := range []string{"/operator/replicas", "/engine/buckets", "/tiers/redis/address", "/activatorExt/keepAliveInterval", "/dataplane/port"} {
		if !strings.Contains(out, "at '"+field+"'") {
			t.Errorf("the schema error does not name %s:\n%s", field, out)
		}
	}

	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	kubeconfig, err := env.Kubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k8s, err := client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"ziptrail-system", "knative-serving", "team-a", "team-b"} {
		if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	// Delegated firing turned off renders the flag false (the operator's
	// default is true, so leaving it out would keep it on).
	if out, err := helm(t, "template", "zt", chart, "--kube-version", "1.36.3", "--set", "engine.delegateTriggers=false"); err != nil || !strings.Contains(out, "--delegate-triggers=false") {
		t.Errorf("engine.delegateTriggers=false: %v, rendered --delegate-triggers=false: %v", err, strings.Contains(out, "--delegate-triggers=false"))
	}
	// Sharded without Redis: refused (a bucket's new owner restores from
	// the checkpoints there).
	if out, err := helm(t, "template", "zt", chart, "--kube-version", "1.36.3", "--set", "engine.sharded=true"); err == nil || !strings.Contains(out, "engine.sharded needs tiers.redis.address") {
		t.Errorf("a sharded engine without Redis: %v\n%s", err, out)
	}
	for name, values := range map[string][]string{"default": nil, "all features": {"-f", allFeatures}} {
		manifest, err := helm(t, append([]string{"template", "zt", chart, "--namespace", "ziptrail-system", "--include-crds", "--kube-version", "1.36.3"}, values...)...)
		if err != nil {
			t.Fatalf("%s: helm template: %v\n%s", name, err, manifest)
		}
		for _, kind := range []string{"kind: Deployment", "kind: ClusterRole", "kind: Job", "kind: CustomResourceDefinition"} {
			if !strings.Contains(manifest, kind) {
				t.Errorf("%s: rendered chart has no %s", name, kind)
			}
		}
		if name == "all features" && !strings.Contains(manifest, "kind: NetworkPolicy") {
			t.Errorf("networkPolicy.enabled renders no NetworkPolicy")
		}
		// activator-ext: the hook swaps the image of Knative's activator;
		// the operator lets its ServiceAccount read the reference keys over
		// the control service. Off by default.
		for _, want := range []string{"--control-key-readers=system:serviceaccount:knative-serving:activator", "activator-ext:v0.1.0", "ZIPTRAIL_KEEPALIVE_INTERVAL"} {
			if got := strings.Contains(manifest, want); got != (name == "all features") {
				t.Errorf("%s: rendered chart contains %q: %v", name, want, got)
			}
		}
		// The operator checks the control stream's tokens with TokenReview;
		// nobody is granted the reference-key Secrets (activator-ext asks
		// the operator).
		if !strings.Contains(manifest, "tokenreviews") || strings.Contains(manifest, "ziptrail-reference-keys") {
			t.Errorf("%s: the operator may not create TokenReviews, or someone is granted the reference-key Secrets", name)
		}
		// Only the elected replica serves the control stream and the
		// gateway: their Services select the leader's pod label. The hooks
		// run in the operator's image; the post-delete one restores Knative
		// and removes the Lease.
		for _, want := range []string{"- knative-config", "- knative-restore", "helm.sh/hook: post-delete", "ziptrail/operator:"} {
			if !strings.Contains(manifest, want) {
				t.Errorf("%s: rendered chart has no %q", name, want)
			}
		}
		// Unsharded (the default), only the elected replica serves them:
		// their Services select the leader's pod label. Sharded (all
		// features), every replica serves its buckets' and forwards the
		// rest.
		for want, sharded := range map[string]bool{`ziptrail.dev/leader: "true"`: false, "--engine-buckets=8": true,
			"--engine-leases=ziptrail-engine.00-of-08,": true} {
			if got := strings.Contains(manifest, want); got != (sharded == (name == "all features")) {
				t.Errorf("%s: rendered chart contains %q: %v", name, want, got)
			}
		}
		// Delegated firing is on in both (the default since issue 33).
		if !strings.Contains(manifest, "--delegate-triggers=true") {
			t.Errorf("%s: the rendered chart does not turn delegated firing on", name)
		}
		// The engine's Lease times apply to both forms: the unsharded
		// leader's Lease and the bucket Leases.
		if !strings.Contains(manifest, "--engine-lease-duration=15s") {
			t.Errorf("%s: the rendered chart does not pass engine.leaseDuration", name)
		}
		if strings.Contains(manifest, "registry.k8s.io/kubectl") {
			t.Errorf("%s: the chart uses an image other than ziptrail's", name)
		}
		if got := strings.Contains(manifest, "--activator-ext=true"); got != (name == "all features") {
			t.Errorf("%s: the hook swaps the activator: %v", name, got)
		}
		// The pod webhook (scoped to ziptrail revision pods, Ignore on
		// failure, TLS from the chart) with the objects volume, on by
		// default; the same-node data plane's webhook and node-dir
		// DaemonSet, off by default.
		for _, want := range []string{"kind: MutatingWebhookConfiguration", "failurePolicy: Ignore", "key: serving.knative.dev/revision",
			"--pod-webhook-port=9445", "caBundle: ", "type: kubernetes.io/tls", "- name: " + podwebhook.ObjectsWebhook, "path: " + podwebhook.ObjectsPath,
			"containerPort: 9445"} {
			if !strings.Contains(manifest, want) {
				t.Errorf("%s: rendered chart has no %q", name, want)
			}
		}
		for _, want := range []string{"kind: DaemonSet", "args: [node-dir", "- name: " + podwebhook.SameNodeWebhook, "path: " + podwebhook.Path + ","} {
			if got := strings.Contains(manifest, want); got != (name == "all features") {
				t.Errorf("%s: rendered chart contains %q: %v", name, want, got)
			}
		}
		if !strings.Contains(manifest, "--gateway-grpc-bind-address=:8089") {
			t.Errorf("%s: the operator gets no gRPC gateway port", name)
		}
		cmd := exec.Command(filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), "--kubeconfig", kubeconfig, "apply", "--dry-run=server", "-f", "-")
		cmd.Stdin = strings.NewReader(manifest)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: kubectl apply --dry-run=server: %v\n%s", name, err, out)
		} else {
			t.Logf("%s:\n%s", name, out)
		}
	}
}
