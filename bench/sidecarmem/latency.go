package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
)

// latencyResult is one pod's invocation latencies (-latency), p50 and p95
// in microseconds: through its queue-proxy, and straight to its user
// container (the floor under both).
type latencyResult struct {
	QueueP50  float64 `json:"queue_p50_us"`
	QueueP95  float64 `json:"queue_p95_us"`
	DirectP50 float64 `json:"user_container_p50_us"`
	DirectP95 float64 `json:"user_container_p95_us"`
}

// measureLatency sends n invocations one after another (after n/10
// warm-up ones) through queue-proxy at queueURL and n straight to the user
// container at userURL, each as the operator's dispatcher sends them
// (call.Send: the envelope, its headers, the kept report asked for):
// stock queue-proxy proxies it as any request, queue-proxy-zl decodes it,
// records its idempotency key, runs it detached and answers with its
// record. The user container answers a small body either way.
func measureLatency(ctx context.Context, id, queueURL, userURL string, n int) (latencyResult, error) {
	var r latencyResult
	for _, path := range []struct {
		url      string
		p50, p95 *float64
	}{{queueURL, &r.QueueP50, &r.QueueP95}, {userURL, &r.DirectP50, &r.DirectP95}} {
		tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
		opts := call.Options{Client: &http.Client{Transport: tr, Timeout: 10 * time.Second}, MaxTries: 1, KeepReport: true,
			URL: func(context.Context, *invocation.Envelope) (string, error) { return path.url, nil }}
		opts.Defaults()
		var ls []time.Duration
		for i := -max(10, n/10); i < n; i++ {
			env := &invocation.Envelope{Namespace: "bench", Workflow: "echo", Function: "echo", Session: "latency-" + id,
				Invocation: fmt.Sprintf("latency-%s.%d", id, i+n), Attempt: 1,
				Objects: []invocation.Object{{Bucket: "in", Key: "x", Size: 1, Inline: []byte("x")}}}
			t := time.Now()
			res := call.Send(ctx, &opts, env)
			d := time.Since(t)
			if res.Err != nil || res.Status != http.StatusOK || string(res.Body) != upstreamBody {
				tr.CloseIdleConnections()
				return r, fmt.Errorf("invocation %d to %s: status %d, body %q, %v", i, path.url, res.Status, res.Body, res.Err)
			}
			if i >= 0 {
				ls = append(ls, d)
			}
		}
		tr.CloseIdleConnections()
		slices.Sort(ls)
		*path.p50 = float64(ls[len(ls)/2].Nanoseconds()) / 1e3
		*path.p95 = float64(ls[len(ls)*95/100].Nanoseconds()) / 1e3
	}
	return r, nil
}

// printLatency prints the medians over the runs of each binary's p50 and
// p95, and what queue-proxy-zl adds over stock queue-proxy (bins[0]) on
// the same invocation.
func printLatency(cfg config, bins []*binary) {
	if cfg.Latency <= 0 {
		return
	}
	med := func(b *binary, get func(latencyResult) float64) float64 {
		vs := []float64{}
		for _, r := range b.Runs {
			if r.Latency != nil {
				vs = append(vs, get(*r.Latency))
			}
		}
		if len(vs) == 0 {
			return -1
		}
		slices.Sort(vs)
		return vs[len(vs)/2]
	}
	fmt.Printf("\nOne invocation as the operator's dispatcher sends it, %d one after another per run (median over the runs of each run's percentile):\n\n", cfg.Latency)
	fmt.Println("| binary | through queue-proxy p50 | p95 | user container alone p50 | p95 | queue-proxy's share p50 |\n|---|---:|---:|---:|---:|---:|")
	for _, b := range bins {
		q, u := med(b, func(l latencyResult) float64 { return l.QueueP50 }), med(b, func(l latencyResult) float64 { return l.DirectP50 })
		fmt.Printf("| %s | %.0f µs | %.0f µs | %.0f µs | %.0f µs | %.0f µs |\n", b.Name, q,
			med(b, func(l latencyResult) float64 { return l.QueueP95 }), u, med(b, func(l latencyResult) float64 { return l.DirectP95 }), q-u)
	}
	stock, zl := bins[0], bins[1]
	added := med(zl, func(l latencyResult) float64 { return l.QueueP50 - l.DirectP50 }) - med(stock, func(l latencyResult) float64 { return l.QueueP50 - l.DirectP50 })
	verdict := "NO"
	if added <= 100 {
		verdict = "yes"
	}
	fmt.Printf("\nAdded by queue-proxy-zl over stock queue-proxy (p50, each over its own user container): %+.0f µs; target ≤ 100 µs: %s\n", added, verdict)
}
