package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
	"github.com/ziptrail/ziptrail/sdk/go/admin"
)

// runDemo is the README's main job, what a user does: the local cluster
// (Kubernetes with the node agent, Knative Serving, the storage tiers) comes
// up, ziptrail is installed on it with `helm install charts/ziptrail`, the
// word count Workflow is applied with kubectl, and a session runs through
// the chart's session gateway; the result is checked against a plain
// computation.
func runDemo(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	input := fs.String("input", "LICENSE", "text file to count words in")
	nodes := fs.Int("nodes", 1, "nodes of the local Kubernetes cluster")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root := paths.RepoRoot()
	text, err := os.ReadFile(filepath.Join(root, *input))
	if err != nil {
		if text, err = os.ReadFile(*input); err != nil {
			return fmt.Errorf("read input: %w", err)
		}
	}
	helm := paths.FindBinary("helm")
	if helm == "" {
		return errors.New("helm not found on PATH or in $ZIPTRAIL_CACHE/bin: run hack/install-deps.sh (make demo does)")
	}
	step := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }
	start := time.Now()

	stateDir, err := os.MkdirTemp("", "ziptrail-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stateDir)
	step("ziptrail local up --no-operator --nodes %d", *nodes)
	c, err := localcluster.Up(ctx, localcluster.Options{StateDir: stateDir, Nodes: *nodes, NoOperator: true, Log: out})
	if err != nil {
		return err
	}
	defer func() {
		step("tearing down the local cluster")
		if err := c.Down(context.Background()); err != nil {
			fmt.Fprintf(out, "warning: %v\n", err)
		}
	}()

	run := func(bin string, args ...string) error {
		cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
		cmd.Stdout, cmd.Stderr, cmd.Dir = out, out, root
		// helm's own configuration and cache stay in the state dir.
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(stateDir, "helm", "cache"),
			"HELM_CONFIG_HOME="+filepath.Join(stateDir, "helm", "config"), "HELM_DATA_HOME="+filepath.Join(stateDir, "helm", "data"))
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w", filepath.Base(bin), strings.Join(args, " "), err)
		}
		return nil
	}
	kubectl := func(args ...string) error {
		return run(filepath.Join(envtest.Assets(), "kubectl"), args...)
	}

	// The chart's operator (2 replicas, leader election), its Services and
	// RBAC; its post-install hook points Knative's queue sidecar at
	// queue-proxy-zl. The tiers are the cluster's redis-server and MinIO.
	const release, releaseNS = "ziptrail", localcluster.SystemNamespace
	install := []string{"install", release, "charts/ziptrail", "--namespace", releaseNS, "--create-namespace", "--wait", "--timeout", "10m"}
	for _, v := range c.HelmValues() {
		install = append(install, "--set", v)
	}
	step("helm install %s charts/ziptrail --namespace %s (the operator's image builds on first use)", release, releaseNS)
	t := time.Now()
	if err := run(helm, install...); err != nil {
		return err
	}
	step("ziptrail installed in %s", time.Since(t).Round(time.Millisecond))
	if err := kubectl("get", "-n", releaseNS, "deployments,services,pods", "-l", "app.kubernetes.io/instance="+release); err != nil {
		return err
	}

	step("kubectl apply -f examples/wordcount/workflow.yaml")
	if err := kubectl("create", "namespace", "demo"); err != nil {
		return err
	}
	if err := kubectl("apply", "-n", "demo", "-f", "examples/wordcount/workflow.yaml"); err != nil {
		return err
	}
	step("waiting for the workflow's functions (Knative Services) to become ready")
	if err := waitReady(ctx, c.Client, "demo", "wordcount", 5*time.Minute); err != nil {
		return err
	}
	if err := kubectl("get", "-n", "demo", "workflows,buckets,triggers,services.serving.knative.dev"); err != nil {
		return err
	}
	// The chart's session gateway, through its Service (kube-proxy routes
	// the host's traffic to the leader's pod).
	svc, err := c.Clientset.CoreV1().Services(releaseNS).Get(ctx, release+"-gateway", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the chart's gateway Service: %w", err)
	}
	gatewayURL := fmt.Sprintf("http://%s:%d", svc.Spec.ClusterIP, svc.Spec.Ports[0].Port)
	for _, p := range svc.Spec.Ports {
		if p.Name == "http-gateway" {
			gatewayURL = fmt.Sprintf("http://%s:%d", svc.Spec.ClusterIP, p.Port)
		}
	}

	step("running a session: word count of %s (%d bytes)", *input, len(text))
	t = time.Now()
	hc := &http.Client{Transport: admin.TokenCredentials(c.GatewayToken).Transport(nil)}
	res, sess, err := runSession(ctx, hc, gatewayURL, "demo", "wordcount", text)
	if err != nil {
		return err
	}
	elapsed := time.Since(t)
	var got struct {
		Total    int      `json:"total"`
		Distinct int      `json:"distinct"`
		Top      [][2]any `json:"top"`
	}
	if err := json.Unmarshal(res, &got); err != nil {
		return fmt.Errorf("result %q: %w", res, err)
	}
	fmt.Fprintf(out, "\n%d words, %d distinct; top %d:\n", got.Total, got.Distinct, len(got.Top))
	for _, kv := range got.Top {
		fmt.Fprintf(out, "  %-14v %v\n", kv[0], kv[1])
	}
	fmt.Fprintf(out, "\nsession %s: %d invocations, %d objects, %s end to end\n", sess.ID, sess.Invocations, sess.Objects, elapsed.Round(time.Millisecond))

	// The check: the same count computed plainly in this process.
	total, distinct, top := plainCount(string(text), 20)
	if got.Total != total || got.Distinct != distinct || len(got.Top) != len(top) {
		return fmt.Errorf("MISMATCH: workflow counted %d words (%d distinct), a plain count gives %d (%d distinct)", got.Total, got.Distinct, total, distinct)
	}
	for i, kv := range got.Top {
		if fmt.Sprint(kv[0]) != top[i].word || fmt.Sprint(kv[1]) != fmt.Sprint(top[i].n) {
			return fmt.Errorf("MISMATCH at rank %d: workflow %s=%s, plain %s=%d", i+1, kv[0], kv[1], top[i].word, top[i].n)
		}
	}
	fmt.Fprintln(out, "✓ matches a plain count of the same input")
	waitCompletedCount(ctx, c.Client, "demo", "wordcount", 1)
	if err := kubectl("get", "-n", "demo", "workflow", "wordcount"); err != nil {
		return err
	}
	step("demo finished in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

type wordCount struct {
	word string
	n    int
}

var wordRE = regexp.MustCompile(`[a-z]+`)

// plainCount mirrors examples/wordcount/wordcount.py's tokenization.
func plainCount(text string, n int) (int, int, []wordCount) {
	counts := map[string]int{}
	total := 0
	for _, w := range wordRE.FindAllString(strings.ToLower(text), -1) {
		counts[w]++
		total++
	}
	list := make([]wordCount, 0, len(counts))
	for w, c := range counts {
		list = append(list, wordCount{w, c})
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].n != list[j].n {
			return list[i].n > list[j].n
		}
		return list[i].word < list[j].word
	})
	return total, len(counts), list[:min(n, len(list))]
}

func waitReady(ctx context.Context, c client.Client, ns, name string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		wf := &v1alpha1.Workflow{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, wf); err == nil &&
			meta.IsStatusConditionTrue(wf.Status.Conditions, v1alpha1.ConditionReady) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("workflow %s/%s not ready after %s (see the pod logs in the state dir)", ns, name, timeout)
		case <-tick.C:
		}
	}
}

// waitCompletedCount waits (briefly) for the Workflow status to count the
// session, so the kubectl output below shows it.
func waitCompletedCount(ctx context.Context, c client.Client, ns, name string, n int64) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		wf := &v1alpha1.Workflow{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, wf); err == nil && wf.Status.Sessions.Completed >= n {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

type sessionInfo struct {
	ID          string `json:"id"`
	State       string `json:"state"`
	Invocations int    `json:"invocations"`
	Objects     int    `json:"objects"`
	Error       string `json:"error"`
}

// runSession starts a session through the gateway and waits for its result.
func runSession(ctx context.Context, hc *http.Client, gateway, ns, wf string, input []byte) ([]byte, sessionInfo, error) {
	var s sessionInfo
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/v1/namespaces/%s/workflows/%s/sessions", gateway, ns, wf), strings.NewReader(string(input)))
	resp, err := hc.Do(req)
	if err != nil {
		return nil, s, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return nil, s, fmt.Errorf("start session: %s: %s", resp.Status, body)
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, s, err
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result?wait=10m", gateway, ns, s.ID), nil)
	resp, err = hc.Do(req)
	if err != nil {
		return nil, s, err
	}
	result, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s", gateway, ns, s.ID), nil)
	if r, err := hc.Do(req); err == nil {
		_ = json.NewDecoder(r.Body).Decode(&s)
		r.Body.Close()
	}
	if resp.StatusCode != http.StatusOK {
		return nil, s, errors.New("session " + s.ID + " " + s.State + ": " + string(result))
	}
	// Read whole: the gateway may free it now rather than after its grace.
	(&gwClient{hc: hc}).ack(ctx, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result", gateway, ns, s.ID))
	return result, s, nil
}
