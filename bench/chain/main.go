// Command chain measures workflow latency on the local cluster: sessions of
// function-oriented chains of 2, 4 and 100 trivial Python functions (each
// returns its input), end to end through the gateway, the trigger engine,
// the dispatcher, the ingress and every pod's queue-proxy-zl. With trivial
// functions the time is the orchestration overhead.
//
// A Workflow holds at most 256 functions, and this machine cannot host a
// pod per function of a 1,000-function chain anyway (two processes of tens
// of MiB each), so -ring measures the 1,000-step chain the design targets
// differently: explicit triggers pass the object around a ring of
// -ring-functions pods, one invocation per step, each through the full path.
//
// -delegate both (the default) runs every chain twice, alternating in
// blocks on the same pods: fired by the engine (the operator's dispatcher
// sends each invocation) and with delegated firing (the producer's sidecar
// sends the next invocation itself; see arms.go). Results go to
// <-out>/chain.json.
//
// -floor (default 2000) first measures what one step cannot go below:
// invocations of a warm function sent as the dispatcher sends them, through
// the ingress, the activator and queue-proxy-zl, without a session
// (floor.go).
//
//	go run ./bench/chain [-lengths 2,4,100] [-sessions 20] [-ring 1000 -ring-functions 10] [-delegate off|on|both] [-rounds 2] [-floor 2000]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
)

const handler = "import ziptrail\ndef handle(inv):\n    return inv.objects[0].bytes()\nziptrail.serve(handle)\n"

// ringHandler is step RING_INDEX of a ring of RING_SIZE functions: it counts
// the step in the object and hands it to the next function's bucket, or to
// the output bucket after RING_STEPS steps.
const ringHandler = `import os, ziptrail
J, F, N = int(os.environ["RING_INDEX"]), int(os.environ["RING_SIZE"]), int(os.environ["RING_STEPS"])
def handle(inv):
    n = int(inv.objects[0].bytes()) + 1
    if n >= N:
        ziptrail.send_object("output", "result", str(n))
    else:
        ziptrail.send_object("h%d" % ((J + 1) % F), str(n), str(n))
ziptrail.serve(handle)
`

func main() {
	lengths := flag.String("lengths", "2,4,100", "chain lengths")
	n := flag.Int("sessions", 20, "measured sessions per chain and arm")
	ring := flag.Int("ring", 0, "also run a chain of this many steps around a ring of functions (0: no)")
	ringFunctions := flag.Int("ring-functions", 10, "functions (pods) in the ring")
	floorN := flag.Int("floor", 2000, "also measure this many invocations of a warm function sent as the dispatcher sends them, without a session (floor.go; 0: no)")
	delegate := flag.String("delegate", "both", "who fires Immediate and ByName triggers: off (the engine), on (the producers' sidecars, delegated firing) or both, alternating on one cluster")
	route := flag.String("route", "direct", "how the operator sends invocations: direct (straight to a ready pod), url (through the ingress and the activator) or both, "+
		"alternating on one cluster (localcluster.SetDirectDispatch, no restart)")
	langs := flag.String("lang", "python", "the functions' language: python, go (the Go SDK, bench/chain/gofunc) or both, one after the other")
	rounds := flag.Int("rounds", 2, "with -delegate both: blocks per arm, alternating (off, on, on, off, ...), each after a switch and a warm-up session")
	warmup := flag.Duration("warmup", 5*time.Second, "warm-up sessions run at least this long at the start of each block")
	out := flag.String("out", "docs/bench", "directory for chain.json (empty: none)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (operator, engine, router) to the file")
	profileDir := flag.String("profile-dir", "", "write a CPU profile of this process for each block's measured sessions to this directory (not with -cpuprofile)")
	perf := flag.Bool("perf", false, "with -profile-dir: also `perf record -a -g` each block (every process on the host)")
	keep := flag.String("state-dir", "", "the local cluster's state directory, kept afterwards (pods' and components' logs; default: a temporary one, removed)")
	flag.Parse()
	arms, err := parseArms(*delegate, *route)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chain:", err)
		os.Exit(2)
	}
	if *cpuProfile != "" && *profileDir != "" {
		fmt.Fprintln(os.Stderr, "chain: -cpuprofile and -profile-dir exclude each other")
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "chain:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	var ls []string
	switch *langs {
	case langPython, langGo:
		ls = []string{*langs}
	case "both":
		ls = []string{langPython, langGo}
	default:
		fmt.Fprintf(os.Stderr, "chain: -lang %q: want python, go or both\n", *langs)
		os.Exit(2)
	}
	if err := run(config{langs: ls, lengths: *lengths, sessions: *n, ring: *ring, ringFunctions: *ringFunctions, floor: *floorN, arms: arms, rounds: max(1, *rounds), out: *out, warmup: *warmup,
		profileDir: *profileDir, perf: *perf, stateDir: *keep}); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "chain:", err)
		os.Exit(1)
	}
}

type config struct {
	lengths                string
	sessions, ring, rounds int
	ringFunctions          int
	floor                  int
	arms                   []arm    // delegation off and/or on, each direct and/or by the route
	langs                  []string // the functions' languages
	out, profileDir        string
	stateDir               string
	perf                   bool
	warmup                 time.Duration
}

func parseArms(delegate, route string) ([]arm, error) {
	var ds, rs []bool
	switch delegate {
	case "off":
		ds = []bool{false}
	case "on":
		ds = []bool{true}
	case "both":
		ds = []bool{false, true}
	default:
		return nil, fmt.Errorf("-delegate %q: want off, on or both", delegate)
	}
	switch route {
	case "direct":
		rs = []bool{true}
	case "url":
		rs = []bool{false}
	case "both":
		rs = []bool{true, false}
	default:
		return nil, fmt.Errorf("-route %q: want direct, url or both", route)
	}
	var arms []arm
	for _, d := range ds {
		for _, r := range rs {
			arms = append(arms, arm{delegate: d, direct: r})
		}
	}
	return arms, nil
}

func run(cfg config) error {
	ctx := context.Background()
	dir := cfg.stateDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "ziptrail-chain-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	// One pod per function, kept warm (min-scale 1): the numbers are the
	// chain's, not cold starts'.
	// Two nodes: 100 functions need 100 pods, and each queue-proxy
	// requests 25m of CPU (Knative's default) from a node of NumCPU cores.
	c, err := localcluster.Up(ctx, localcluster.Options{StateDir: dir, Nodes: 2, Log: os.Stderr, EngineFiresAll: !cfg.arms[0].delegate, RouteOnly: !cfg.arms[0].direct,
		Knative: map[string]map[string]string{"config-autoscaler": {"min-scale": "1"}},
		Kubernetes: k8s.Options{NetPrefix: "ztc", ClusterCIDR: netip.MustParsePrefix("10.218.0.0/16"),
			ServiceCIDR: netip.MustParsePrefix("10.104.0.0/16"), WaitForHost: 30 * time.Minute}})
	if err != nil {
		return err
	}
	defer c.Down(context.Background())
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}); err != nil {
		return err
	}
	rep := report{Host: hostInfo(), Sessions: cfg.sessions, Rounds: cfg.rounds}
	fmt.Println("| chain | firing | sessions | p50 | p95 | per step (p50) | delegated firings a session |\n|---|---|---|---|---|---|---|")
	for _, lang := range cfg.langs {
		if cfg.floor > 0 {
			rows, err := floor(ctx, c, cfg.floor, lang)
			if err != nil {
				return err
			}
			rep.Results = append(rep.Results, rows...)
		}
		for _, ls := range strings.Split(cfg.lengths, ",") {
			if ls == "" {
				continue
			}
			length, err := strconv.Atoi(ls)
			if err != nil {
				return err
			}
			rows, err := measure(ctx, c, cfg, chainWorkflow(length, lang), fmt.Sprintf("%d functions%s", length, langLabel(lang)), length, 0, "x", "x")
			if err != nil {
				return err
			}
			rep.Results = append(rep.Results, rows...)
		}
		if cfg.ring > 0 {
			label := fmt.Sprintf("%d steps, ring of %d%s", cfg.ring, cfg.ringFunctions, langLabel(lang))
			rows, err := measure(ctx, c, cfg, ringWorkflow(cfg.ring, cfg.ringFunctions, lang), label, cfg.ring, cfg.ring-1, "0", strconv.Itoa(cfg.ring))
			if err != nil {
				return err
			}
			rep.Results = append(rep.Results, rows...)
		}
	}
	rep.Host.LoadAfter = loadavg()
	if cfg.out == "" {
		return nil
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cfg.out, "chain.json"), append(js, '\n'), 0o644)
}

// The functions' languages (-lang): Python, the SDK most users write
// with, and Go, whose function server costs little enough to show the
// platform's own cost.
const (
	langPython = "python"
	langGo     = "go"
)

func langLabel(lang string) string {
	if lang == langGo {
		return " (Go)"
	}
	return ""
}

// function is a chain's or a ring's function in lang: inline Python code
// (handler or ringHandler) or the same in Go (bench/chain/gofunc).
func function(lang, name, code string, env ...corev1.EnvVar) v1alpha1.FunctionSpec {
	if lang == langGo {
		return v1alpha1.FunctionSpec{Name: name, Image: "ghcr.io/ziptrail/bench-chain-go:latest", Env: env}
	}
	return pythonFunction(name, code, env...)
}

// pythonFunction runs inline Python code on the image catalog's generic
// Python (config/local/images.yaml), which has the SDK on PYTHONPATH.
func pythonFunction(name, code string, env ...corev1.EnvVar) v1alpha1.FunctionSpec {
	return v1alpha1.FunctionSpec{Name: name, Image: "ghcr.io/ziptrail/python:3", Command: []string{"python3", "-c", code}, Env: env}
}

// chainWorkflow is f0 -> f1 -> ... -> f(length-1), each returning its input.
func chainWorkflow(length int, lang string) *v1alpha1.Workflow {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("chain%d%s", length, langSuffix(lang)), Namespace: "bench"}, Spec: v1alpha1.WorkflowSpec{Entry: "f0"}}
	for i := 0; i < length; i++ {
		wf.Spec.Functions = append(wf.Spec.Functions, function(lang, fmt.Sprintf("f%d", i), handler))
		if i > 0 {
			wf.Spec.Dependencies = append(wf.Spec.Dependencies, v1alpha1.Dependency{From: []string{fmt.Sprintf("f%d", i-1)}, To: []string{fmt.Sprintf("f%d", i)}})
		}
	}
	return wf
}

// ringWorkflow is a chain of steps invocations around functions r0..r(size-1):
// r(j) writes bucket h(j+1 mod size), whose Immediate trigger invokes r(j+1).
func ringWorkflow(steps, size int, lang string) *v1alpha1.Workflow {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ring%d%s", steps, langSuffix(lang)), Namespace: "bench"},
		Spec: v1alpha1.WorkflowSpec{Entry: "r0", Buckets: []v1alpha1.NamedBucket{{Name: "output"}}}}
	for j := 0; j < size; j++ {
		fn, bucket := fmt.Sprintf("r%d", j), fmt.Sprintf("h%d", j)
		wf.Spec.Functions = append(wf.Spec.Functions, function(lang, fn, ringHandler,
			corev1.EnvVar{Name: "RING_INDEX", Value: strconv.Itoa(j)}, corev1.EnvVar{Name: "RING_SIZE", Value: strconv.Itoa(size)},
			corev1.EnvVar{Name: "RING_STEPS", Value: strconv.Itoa(steps)}))
		wf.Spec.Buckets = append(wf.Spec.Buckets, v1alpha1.NamedBucket{Name: bucket})
		wf.Spec.Triggers = append(wf.Spec.Triggers, v1alpha1.NamedTrigger{Name: "to-" + fn,
			Spec: v1alpha1.TriggerSpec{Bucket: bucket, Primitive: v1alpha1.Immediate, Targets: []string{fn}}})
	}
	return wf
}

// langSuffix keeps the workflows of two languages apart.
func langSuffix(lang string) string {
	if lang == langGo {
		return "go"
	}
	return ""
}

// percentile is the nearest-rank percentile of sorted latencies.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func waitReady(ctx context.Context, c client.Client, wf *v1alpha1.Workflow, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		got := &v1alpha1.Workflow{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(wf), got); err == nil && meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady) {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s", wf.Name, timeout)
}

func session(gateway, token, wf, input string) (string, error) {
	do := func(method, url string, body io.Reader) (*http.Response, error) {
		req, err := http.NewRequest(method, url, body)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		return http.DefaultClient.Do(req)
	}
	resp, err := do(http.MethodPost, gateway+"/v1/namespaces/bench/workflows/"+wf+"/sessions", strings.NewReader(input))
	if err != nil {
		return "", err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("start: %s %s", resp.Status, body)
	}
	id := strings.Split(strings.Split(string(body), `"id":"`)[1], `"`)[0]
	r, err := do(http.MethodGet, gateway+"/v1/namespaces/bench/sessions/"+id+"/result?wait=1m", nil)
	if err != nil {
		return "", err
	}
	defer r.Body.Close()
	out, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		return "", fmt.Errorf("session %s: %s %s", id, r.Status, out)
	}
	return string(out), nil
}
