package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch"
)

// The Knative floor: what one step costs before any of ziptrail's
// orchestration. A step of a chain is at least one invocation through
// Knative's data path; -floor sends n invocations, one after another, to a
// warm function of a deployed workflow the way the operator's dispatcher
// sends them (the same envelope, headers, HTTP client and dial to the
// cluster-local ingress), but from this process and with no session
// behind them: no gateway, no engine decision, no trigger, no reports
// awaited. Each goes ingress -> Knative's activator (in the path as for
// every function: same autoscaler settings) -> queue-proxy-zl (which
// decodes the envelope and passes it on) -> the Python SDK's function
// server (which decodes it, runs the echo handler and answers) and back.
// A chain's per-step time minus this floor is what ziptrail's
// orchestration adds.

// floor deploys a one-function workflow and measures n invocations of its
// function on each path; its rows have Steps 1 and Firing "none". Besides
// the path a step takes, two shorter ones for the decomposition: straight
// to the pod's queue-proxy-zl (no ingress, no activator), and straight to
// the function server (no Knative at all).
func floor(ctx context.Context, c *localcluster.Cluster, n int, lang string) ([]row, error) {
	wf := chainWorkflow(1, lang)
	wf.Name = "floor" + langSuffix(lang)
	remove, err := deploy(ctx, c, wf)
	if err != nil {
		return nil, err
	}
	defer remove()
	svc := controllers.ServiceName(wf.Name, "f0")
	u, err := dispatch.ServiceResolver{Reader: c.Client}.URL(ctx, wf.Namespace, svc)
	if err != nil {
		return nil, err
	}
	pods, err := c.FunctionPods(ctx, wf.Namespace, svc)
	if err != nil || len(pods) == 0 || pods[0].Status.PodIP == "" {
		return nil, fmt.Errorf("the pod of %s: %v (%d pods)", svc, err, len(pods))
	}
	ip := pods[0].Status.PodIP
	paths := []struct{ label, dial string }{
		// As dispatch.New dials the ingress for every request.
		{"Knative floor: ingress, activator, queue-proxy-zl, function" + langLabel(lang), strings.TrimPrefix(c.Knative.IngressLocalURL, "http://")},
		// What a step sent by direct routing (docs/dispatch.md) cannot go below.
		{"straight to the pod: queue-proxy-zl, function" + langLabel(lang), net.JoinHostPort(ip, "8012")},
		{"the function server alone" + langLabel(lang), net.JoinHostPort(ip, "8080")},
	}
	var rows []row
	for _, p := range paths {
		r, err := floorPath(ctx, p.label, p.dial, u.String(), wf.Namespace, wf.Name, svc, n)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// floorPath measures n invocations sent to url over connections dialed to
// dial, after a warm-up.
func floorPath(ctx context.Context, label, dial, url, ns, wfName, svc string, n int) (row, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return dialer.DialContext(ctx, network, dial)
	}
	defer tr.CloseIdleConnections()
	// As the operator's dispatcher asks (dispatch.New): the report kept.
	opts := call.Options{Client: &http.Client{Transport: tr, Timeout: time.Minute}, MaxTries: 1, KeepReport: true,
		URL: func(context.Context, *invocation.Envelope) (string, error) { return url, nil }}
	opts.Defaults()
	one := func(i int) (time.Duration, error) {
		// Each path's invocations are its own: a second delivery of an id
		// would be answered from the sidecar's idempotency record,
		// without running the function.
		return floorCall(ctx, &opts, floorEnvelope(ns, wfName, svc, fmt.Sprintf("f-%s-%d", idPart(label), i)), label, i)
	}
	// Warm-up: connections, the activator's view of the pod.
	ls, err := timed(max(50, n/10), n, one)
	if err != nil {
		return row{}, err
	}
	r := latencyRow(label, "none", 1, ls)
	r.print("–")
	return r, nil
}

// idPart is s in letters, digits and dashes, for an invocation id.
func idPart(s string) string {
	return strings.Trim(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '-'
	}, s), "-")
}

// cycleFloor is the floor of a chain's own requests: n invocations sent
// straight to the queue-proxy-zl of wf's functions' pods, one after the
// other and each to the next function's pod in turn (f0, f1, ..., f0, ...),
// as a chain's steps go, with no session behind them. Against the floor to
// one warm pod it shows what taking turns between many pods costs a
// request on this host (each pod's processes wake up after the others
// ran), which no orchestration can remove.
func cycleFloor(ctx context.Context, c *localcluster.Cluster, wf *v1alpha1.Workflow, label string, n int) ([]time.Duration, error) {
	type target struct{ addr, svc string }
	var targets []target
	for _, f := range wf.Spec.Functions {
		svc := controllers.ServiceName(wf.Name, f.Name)
		pods, err := c.FunctionPods(ctx, wf.Namespace, svc)
		if err != nil || len(pods) == 0 || pods[0].Status.PodIP == "" {
			return nil, fmt.Errorf("the pod of %s: %v (%d pods)", svc, err, len(pods))
		}
		targets = append(targets, target{net.JoinHostPort(pods[0].Status.PodIP, "8012"), svc})
	}
	tr := call.DirectTransport(nil, 1)
	defer tr.CloseIdleConnections()
	opts := call.Options{Client: &http.Client{Transport: tr, Timeout: time.Minute}, MaxTries: 1, KeepReport: true}
	opts.Defaults()
	one := func(i int) (time.Duration, error) {
		t := targets[(i%len(targets)+len(targets))%len(targets)]
		opts.URL = func(context.Context, *invocation.Envelope) (string, error) { return "http://" + t.addr + "/", nil }
		id := fmt.Sprintf("c-%s-%d-%d", idPart(label), time.Now().UnixNano(), i)
		return floorCall(ctx, &opts, floorEnvelope(wf.Namespace, wf.Name, t.svc, id), label, i)
	}
	return timed(len(targets), n, one) // warm-up: a connection to every pod
}

// floorEnvelope is a floor's invocation of the echo function: one inline
// object "x", no session behind it.
func floorEnvelope(ns, wf, svc, id string) *invocation.Envelope {
	return &invocation.Envelope{Namespace: ns, Workflow: wf, Function: svc, Session: "floor-000000000000", Invocation: id, Attempt: 1,
		Objects: []invocation.Object{{Bucket: "in", Key: "x", Size: 1, Inline: []byte("x")}}}
}

// floorCall sends env as the dispatcher does and times it; the echo
// function must answer "x".
func floorCall(ctx context.Context, opts *call.Options, env *invocation.Envelope, label string, i int) (time.Duration, error) {
	start := time.Now()
	res := call.Send(ctx, opts, env)
	lat := time.Since(start)
	if res.Err != nil || res.Status != http.StatusOK || string(res.Body) != "x" {
		return 0, fmt.Errorf("%s: invocation %d: status %d, body %q, %v", label, i, res.Status, res.Body, res.Err)
	}
	return lat, nil
}

// timed makes warm untimed calls (ids 0, -1, ...), then n timed ones.
func timed(warm, n int, one func(i int) (time.Duration, error)) ([]time.Duration, error) {
	for i := 0; i < warm; i++ {
		if _, err := one(-i); err != nil {
			return nil, err
		}
	}
	var ls []time.Duration
	for i := 0; i < n; i++ {
		l, err := one(i)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}
