// Command coldstart measures cold starts on the local cluster (real
// Knative Serving, the KPA autoscaler and the activator), in one run:
//
//  1. A function invoked with a reference while it is scaled to zero:
//     `hold` (one pod, always up) sends a 1 MiB object, which stays in its
//     pod, to bucket big; the bucket's Immediate trigger invokes `read`
//     (min-scale 0), which Knative starts from zero through the activator,
//     and `read` pulls the object by reference. Per round: invocation →
//     function start (time.time() in `hold` right after send_object returned
//     vs at the top of `read`'s handler; pods are processes on this host,
//     so both read the same clock), the whole session as the client sees it,
//     and the bytes `read` got.
//  2. The same pair with `read` kept warm (min-scale 1): the baseline.
//  3. The autoscaler's reaction under load: a function (min-scale 1,
//     max-scale 4, container concurrency 1) whose handler sleeps 1 s gets a
//     session every 250 ms; the time from the start of the load to the 2nd
//     and 3rd Ready pod.
//
// The two timestamps travel back in the result: `hold` sends its own to
// bucket done after the big object, `read` sends its start, the length
// it read and whether it was mapped from shared memory to done, and `join`
// (a warm pod; a BySet trigger on both keys) writes them to the output.
// That adds one warm hop to the whole session's time, not to invocation →
// start.
//
//	go run ./bench/coldstart [-n 20] [-autoscale-reps 3] [-out docs/bench]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
)

const (
	namespace = "bench"
	blobSize  = 1 << 20 // above the inline threshold: by reference
	window    = "6s"    // the functions' and the cluster's stable window
)

// holdHandler sends the session's blob (a reference: it stays in this pod)
// and then its stamps: before send_object and when it returned.
var holdHandler = fmt.Sprintf(`import json, time, ziptrail
N = %d
def handle(inv):
    seed = inv.objects[0].bytes()
    unit = seed + bytes(range(256))
    blob = (unit * (N // len(unit) + 1))[:N]
    before = time.time()
    ziptrail.send_object("big", "blob", blob, metadata={"seed": seed.decode()})
    sent = time.time()
    ziptrail.send_object("done", "sent", json.dumps([before, sent]))
    return b""
ziptrail.serve(handle)
`, blobSize)

// readHandler stamps its start first, then reads the object (a pull from
// the holder's pod) and reports what it got.
const readHandler = `import json, time, ziptrail
def handle(inv):
    start = time.time()
    o = inv.objects[0]
    data = o.bytes()
    ok = data.startswith(o.metadata["seed"].encode())
    ziptrail.send_object("done", "read", json.dumps({"start": start, "len": len(data), "mapped": o._map is not None, "ok": ok}))
    return b""
ziptrail.serve(handle)
`

// joinHandler writes both stamps to the output bucket.
const joinHandler = `import json, ziptrail
def handle(inv):
    r = json.loads(inv.object("done", "read").bytes())
    r["before"], r["sent"] = json.loads(inv.object("done", "sent").bytes())
    ziptrail.send_object("output", "result", json.dumps(r))
    return b""
ziptrail.serve(handle)
`

// workHandler works 1 s per invocation and returns its input.
const workHandler = `import time, ziptrail
def handle(inv):
    time.sleep(1)
    return inv.objects[0].bytes()
ziptrail.serve(handle)
`

// Round is one session of the hold → read pair.
type Round struct {
	InvokeToStartMs float64 `json:"invokeToStartMs"` // hold's send_object returned → read's handler started
	SessionMs       float64 `json:"sessionMs"`       // client: start → result
	SendMs          float64 `json:"sendMs"`          // hold's send_object of the 1 MiB object
	Bytes           int     `json:"bytes"`           // what read got from the reference
	Mapped          bool    `json:"mapped"`          // read it from shared memory (pulled into its sidecar)
	PodStarted      bool    `json:"podStarted"`      // a read pod appeared during the session (cold rounds)
	// Cold rounds, from hold's stamp, seen by listing pods every 100 ms:
	// the read pod exists, and it is Ready.
	PodSeenMs  float64 `json:"podSeenMs,omitempty"`
	PodReadyMs float64 `json:"podReadyMs,omitempty"`
	// Cold rounds, from the end of this session: Knative scaled read to
	// zero (no pod left that is not terminating), and its pod is gone.
	ScaledToZeroMs float64 `json:"scaledToZeroMs,omitempty"`
	PodGoneMs      float64 `json:"podGoneMs,omitempty"`
}

// Stats are nearest-rank percentiles in milliseconds.
type Stats struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

// Scale is one repetition of the load on the autoscaled function.
type Scale struct {
	SecondReadyMs float64 `json:"secondReadyMs"` // load start → 2nd Ready pod
	ThirdReadyMs  float64 `json:"thirdReadyMs"`  // load start → 3rd Ready pod
	MaxReady      int     `json:"maxReady"`
	Sessions      int     `json:"sessions"`
	LoadSeconds   float64 `json:"loadSeconds"`
	BackToOneMs   float64 `json:"backToOneMs"` // last result → one pod left
}

type report struct {
	Host    map[string]any `json:"host"`
	Config  map[string]any `json:"config"`
	Cold    []Round        `json:"cold"`
	Warm    []Round        `json:"warm"`
	Summary map[string]any `json:"summary"`
	Scale   []Scale        `json:"autoscale"`
}

func main() {
	n := flag.Int("n", 20, "rounds of the cold and of the warm pair")
	reps := flag.Int("autoscale-reps", 3, "repetitions of the load on the autoscaled function")
	interval := flag.Duration("interval", 250*time.Millisecond, "time between sessions of the load")
	out := flag.String("out", "docs/bench", "directory for coldstart.json and coldstart.md (empty: none)")
	flag.Parse()
	if err := run(*n, *reps, *interval, *out); err != nil {
		fmt.Fprintln(os.Stderr, "coldstart:", err)
		os.Exit(1)
	}
}

func run(n, reps int, interval time.Duration, outDir string) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "ziptrail-coldstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	autoscaler := map[string]string{"scale-to-zero-grace-period": "2s", "stable-window": window}
	t0 := time.Now()
	c, err := localcluster.Up(ctx, localcluster.Options{StateDir: dir, Nodes: 2, Log: os.Stderr,
		Knative: map[string]map[string]string{"config-autoscaler": autoscaler},
		Kubernetes: k8s.Options{NetPrefix: "ztcs", ClusterCIDR: netip.MustParsePrefix("10.230.0.0/16"),
			ServiceCIDR: netip.MustParsePrefix("10.107.0.0/16"),
			WaitForHost: 45 * time.Minute}}) // other suites may hold the host's one cluster
	if err != nil {
		return err
	}
	defer c.Down(context.Background())
	fmt.Fprintf(os.Stderr, "cluster up in %s\n", time.Since(t0).Round(time.Second))
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return err
	}
	b := &bench{c: c, ctx: ctx}
	rep := report{
		Host: hostInfo(),
		Config: map[string]any{"rounds": n, "objectBytes": blobSize, "configAutoscaler": autoscaler,
			"revisionWindow": window, "loadIntervalMs": interval.Milliseconds(), "autoscaleReps": reps, "nodes": 2},
		Summary: map[string]any{},
	}

	// 1. Cold: read scaled to zero before every round.
	if rep.Cold, err = b.pair("cold", 0, n); err != nil {
		return err
	}
	// 2. Warm baseline: read kept up; one warm-up session first.
	if rep.Warm, err = b.pair("warm", 1, n); err != nil {
		return err
	}
	// 3. The autoscaler under load.
	if rep.Scale, err = b.autoscale(reps, interval); err != nil {
		return err
	}

	col := func(rs []Round, f func(Round) float64) Stats {
		var v []float64
		for _, r := range rs {
			if x := f(r); x != 0 {
				v = append(v, x)
			}
		}
		return stats(v)
	}
	inv := func(r Round) float64 { return r.InvokeToStartMs }
	ses := func(r Round) float64 { return r.SessionMs }
	rep.Summary["coldInvokeToStart"] = col(rep.Cold, inv)
	rep.Summary["coldSession"] = col(rep.Cold, ses)
	rep.Summary["coldBytes"] = col(rep.Cold, func(r Round) float64 { return float64(r.Bytes) })
	rep.Summary["coldPodSeen"] = col(rep.Cold, func(r Round) float64 { return r.PodSeenMs })
	rep.Summary["coldPodReady"] = col(rep.Cold, func(r Round) float64 { return r.PodReadyMs })
	rep.Summary["coldScaledToZero"] = col(rep.Cold, func(r Round) float64 { return r.ScaledToZeroMs })
	rep.Summary["coldPodGone"] = col(rep.Cold, func(r Round) float64 { return r.PodGoneMs })
	rep.Summary["warmInvokeToStart"] = col(rep.Warm, inv)
	rep.Summary["warmSession"] = col(rep.Warm, ses)
	rep.Summary["coldSend"] = col(rep.Cold, func(r Round) float64 { return r.SendMs })
	rep.Summary["warmSend"] = col(rep.Warm, func(r Round) float64 { return r.SendMs })
	var second, third []float64
	for _, s := range rep.Scale {
		second, third = append(second, s.SecondReadyMs), append(third, s.ThirdReadyMs)
	}
	rep.Summary["secondReadyPod"], rep.Summary["thirdReadyPod"] = stats(second), stats(third)

	md := markdown(rep)
	fmt.Print("\n" + md)
	if outDir == "" {
		return nil
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(outDir, "coldstart.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(outDir, "coldstart.md"), []byte("# Cold starts (`bench/coldstart`)\n\n"+md), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s and %s\n", filepath.Join(outDir, "coldstart.json"), filepath.Join(outDir, "coldstart.md"))
	return nil
}

type bench struct {
	c   *localcluster.Cluster
	ctx context.Context
}

// fn is a Python function on the image catalog's generic Python with its
// scale bounds, container concurrency (0: Knative's default) and revision
// annotations.
func fn(name, code string, minScale, maxScale int32, cc int64, annotations map[string]string) v1alpha1.FunctionSpec {
	f := v1alpha1.FunctionSpec{Name: name, Image: "ghcr.io/ziptrail/python:3", Command: []string{"python3", "-c", code},
		MinScale: &minScale, MaxScale: &maxScale}
	if cc > 0 {
		f.ContainerConcurrency = &cc
	}
	if len(annotations) > 0 {
		raw, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
		f.Template = &runtime.RawExtension{Raw: raw}
	}
	return f
}

// pair deploys hold → read (read with min-scale readMin) and runs n rounds;
// with readMin 0 each round waits for read to have no pod first.
func (b *bench) pair(name string, readMin int32, n int) ([]Round, error) {
	win := map[string]string{"autoscaling.knative.dev/window": window}
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: v1alpha1.WorkflowSpec{
		Entry: "hold",
		Functions: []v1alpha1.FunctionSpec{
			fn("hold", holdHandler, 1, 1, 0, nil),
			fn("read", readHandler, readMin, 1, 0, win),
			fn("join", joinHandler, 1, 1, 0, nil),
		},
		Buckets: []v1alpha1.NamedBucket{{Name: "big"}, {Name: "done"}, {Name: "output"}},
		Triggers: []v1alpha1.NamedTrigger{
			{Name: "read-blob", Spec: v1alpha1.TriggerSpec{Bucket: "big", Primitive: v1alpha1.Immediate, Targets: []string{"read"}}},
			{Name: "join", Spec: v1alpha1.TriggerSpec{Bucket: "done", Primitive: v1alpha1.BySet,
				BySet: &v1alpha1.BySetParams{Keys: []string{"sent", "read"}}, Targets: []string{"join"}}},
		},
	}}
	if err := b.deploy(wf); err != nil {
		return nil, err
	}
	defer b.remove(wf)
	readSvc := name + "-read"
	var rounds []Round
	for i := -1; i < n; i++ { // round -1: warm-up, not counted
		var zero, gone time.Duration
		if readMin == 0 {
			t := time.Now()
			if err := b.waitPods(readSvc, 10*time.Minute, func(_, live, _ int) bool { return live == 0 }); err != nil {
				return nil, fmt.Errorf("%s: waiting for read to scale to zero: %w", name, err)
			}
			zero = time.Since(t)
			if err := b.waitPods(readSvc, 10*time.Minute, func(all, _, _ int) bool { return all == 0 }); err != nil {
				return nil, fmt.Errorf("%s: waiting for read's pod to go: %w", name, err)
			}
			gone = time.Since(t)
		}
		w := b.watch(readSvc)
		r, sent, err := b.round(wf.Name, fmt.Sprintf("%s-%02d", name, i+1))
		w.stop()
		if err != nil {
			return nil, err
		}
		r.PodStarted = w.maxAll > 0
		if readMin == 0 {
			if t := w.seen; !t.IsZero() {
				r.PodSeenMs = ms(t.Sub(sent))
			}
			if t := w.readyAt(1); !t.IsZero() {
				r.PodReadyMs = ms(t.Sub(sent))
			}
		}
		if i > 0 && readMin == 0 {
			// The wait before this round started when the previous one ended.
			rounds[len(rounds)-1].ScaledToZeroMs, rounds[len(rounds)-1].PodGoneMs = ms(zero), ms(gone)
		}
		if readMin == 0 && !r.PodStarted {
			return nil, fmt.Errorf("%s: round %d: no read pod seen during the session", name, i+1)
		}
		if i >= 0 {
			rounds = append(rounds, r)
		}
		fmt.Fprintf(os.Stderr, "%s %2d: send_object %.1f ms; invocation -> start %8.1f ms (pod listed %.0f ms, Ready %.0f ms), session %8.1f ms, %d bytes (mapped %v); before it: scaled to zero %.0f ms, pod gone %.0f ms\n",
			name, i+1, r.SendMs, r.InvokeToStartMs, r.PodSeenMs, r.PodReadyMs, r.SessionMs, r.Bytes, r.Mapped, ms(zero), ms(gone))
	}
	return rounds, nil
}

// round runs one session of the pair and checks what read got; it returns
// hold's stamp too.
func (b *bench) round(wf, seed string) (Round, time.Time, error) {
	t := time.Now()
	out, err := session(b.c.GatewayURL, b.c.GatewayToken, wf, seed)
	total := time.Since(t)
	if err != nil {
		return Round{}, time.Time{}, err
	}
	var res struct {
		Start, Sent, Before float64
		Len                 int
		Mapped, OK          bool
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return Round{}, time.Time{}, fmt.Errorf("%s: result %q: %w", wf, out, err)
	}
	if res.Len != blobSize || !res.OK {
		return Round{}, time.Time{}, fmt.Errorf("%s: read got %d bytes (want %d), content ok %v", wf, res.Len, blobSize, res.OK)
	}
	sent := time.Unix(0, int64(res.Sent*1e9))
	return Round{InvokeToStartMs: (res.Start - res.Sent) * 1e3, SessionMs: ms(total), SendMs: (res.Sent - res.Before) * 1e3, Bytes: res.Len, Mapped: res.Mapped}, sent, nil
}

// autoscale puts a session every interval on a function that works 1 s per
// invocation, one at a time per pod, until its 3rd pod is Ready, reps times.
func (b *bench) autoscale(reps int, interval time.Duration) ([]Scale, error) {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "load", Namespace: namespace}, Spec: v1alpha1.WorkflowSpec{
		Entry:     "work",
		Functions: []v1alpha1.FunctionSpec{fn("work", workHandler, 1, 4, 1, map[string]string{"autoscaling.knative.dev/window": window})},
		Buckets:   []v1alpha1.NamedBucket{{Name: "output"}},
	}}
	if err := b.deploy(wf); err != nil {
		return nil, err
	}
	defer b.remove(wf)
	const svc = "load-work"
	var out []Scale
	for rep := 0; rep < reps; rep++ {
		// One pod, nothing terminating.
		if err := b.waitPods(svc, 10*time.Minute, func(all, _, ready int) bool { return all == 1 && ready == 1 }); err != nil {
			return nil, fmt.Errorf("load: waiting for one pod: %w", err)
		}
		w := b.watch(svc)
		start := time.Now()
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			failed []string
			count  int
		)
		deadline := start.Add(5 * time.Minute)
		for i := 0; w.readyAt(3).IsZero() && time.Now().Before(deadline); i++ {
			input := fmt.Sprintf("r%d-%04d", rep, i)
			count++
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := session(b.c.GatewayURL, b.c.GatewayToken, wf.Name, input)
				if err == nil && got != input {
					err = fmt.Errorf("result %q, want %q", got, input)
				}
				if err != nil {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("%s: %v", input, err))
					mu.Unlock()
				}
			}()
			time.Sleep(interval)
		}
		load := time.Since(start)
		wg.Wait()
		done := time.Now()
		w.stop()
		if len(failed) > 0 {
			return nil, fmt.Errorf("load: %d of %d sessions failed:\n%s", len(failed), count, strings.Join(failed, "\n"))
		}
		if w.readyAt(3).IsZero() {
			return nil, fmt.Errorf("load: no 3rd Ready pod after %s of load (max %d)", load.Round(time.Second), w.maxReady)
		}
		if err := b.waitPods(svc, 10*time.Minute, func(all, _, ready int) bool { return all == 1 && ready == 1 }); err != nil {
			return nil, fmt.Errorf("load: waiting for the scale-down: %w", err)
		}
		s := Scale{SecondReadyMs: ms(w.readyAt(2).Sub(start)), ThirdReadyMs: ms(w.readyAt(3).Sub(start)), MaxReady: w.maxReady,
			Sessions: count, LoadSeconds: load.Seconds(), BackToOneMs: ms(time.Since(done))}
		fmt.Fprintf(os.Stderr, "load %d: 2nd Ready pod %.0f ms, 3rd %.0f ms after the load started; %d sessions over %.1f s, 0 failed; back to one pod %.0f ms after the last result\n",
			rep+1, s.SecondReadyMs, s.ThirdReadyMs, s.Sessions, s.LoadSeconds, s.BackToOneMs)
		out = append(out, s)
	}
	return out, nil
}
