package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// delegEvents records what sidecars report and welcomes the workflow's
// pods with its delegated triggers, as the orchestrator does.
type delegEvents struct {
	mu       sync.Mutex
	objects  []*controlv1.ObjectReady
	finished []*controlv1.FunctionFinished
	started  []*controlv1.FunctionStarted
	// What the producer's sidecar reports of its own, engine-dispatched
	// invocation (every invocation's outcome is reported): set aside.
	own     []string
	ownEnds chan string // the producer's own ends, when set
	got     chan struct{}
	deleg   *controlv1.Delegations
}

func (e *delegEvents) note(f func()) {
	e.mu.Lock()
	f()
	e.mu.Unlock()
	e.got <- struct{}{}
}
func (e *delegEvents) ObjectReady(_ context.Context, _ control.Identity, ev *controlv1.ObjectReady) error {
	if ev.ProducerFunction == "entry" {
		e.mu.Lock()
		e.own = append(e.own, "object "+ev.InvocationId+" "+ev.Bucket+"/"+ev.Key)
		e.mu.Unlock()
		return nil
	}
	e.note(func() { e.objects = append(e.objects, ev) })
	return nil
}
func (e *delegEvents) FunctionStarted(_ context.Context, _ control.Identity, ev *controlv1.FunctionStarted) error {
	e.note(func() { e.started = append(e.started, ev) })
	return nil
}
func (e *delegEvents) FunctionFinished(_ context.Context, _ control.Identity, ev *controlv1.FunctionFinished) error {
	if ev.Function == "entry" {
		e.mu.Lock()
		e.own = append(e.own, fmt.Sprintf("finished %s failed=%v outputs=%d", ev.InvocationId, ev.Failed, ev.OutputsSent))
		e.mu.Unlock()
		if e.ownEnds != nil {
			e.ownEnds <- ev.InvocationId
		}
		return nil
	}
	e.note(func() { e.finished = append(e.finished, ev) })
	return nil
}
func (e *delegEvents) Welcome(id control.Identity) []*controlv1.OperatorMessage {
	e.mu.Lock()
	deleg := e.deleg
	e.mu.Unlock()
	if id.Workflow != "wf" || deleg == nil {
		return nil
	}
	return []*controlv1.OperatorMessage{{Msg: &controlv1.OperatorMessage_Delegations{Delegations: deleg}}}
}

// TestDelegatedFiring runs a producer's and a consumer's sidecar against
// the real control server: the producer's sidecar invokes the delegated
// trigger's target itself for each matching output (the derived id, the
// dispatcher's request) and says so on the outputs it returns; a route it
// cannot reach is left to the engine (nothing claimed); what the function
// itself wrote as fired is dropped; a re-execution fires nothing itself;
// the consumer's sidecar reports the delegated invocation's start (with
// the arguments a re-execution needs), its outputs and its end, with its
// return value, over its own control stream.
func TestDelegatedFiring(t *testing.T) {
	ev := &delegEvents{got: make(chan struct{}, 64), ownEnds: make(chan string, 64)}
	addr := controlServer(t, ev)

	run := func(pod, fn string) *Sidecar { return workflowSidecar(t, addr, pod, fn) }
	consumer := run("c", "work")
	var mu sync.Mutex
	var received []invocation.Envelope
	cfn := httptest.NewServer(consumer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var env invocation.Envelope
		_ = json.NewDecoder(r.Body).Decode(&env)
		mu.Lock()
		received = append(received, env)
		mu.Unlock()
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		_ = json.NewEncoder(w).Encode(invocation.Outputs{Return: []byte("ret-" + env.Objects[0].Key),
			Objects: []invocation.Object{{Bucket: "out", Key: "o-" + env.Objects[0].Key, Inline: []byte("y")}}})
	})))
	defer cfn.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // a route that does not answer
	deleg := &controlv1.Delegations{Triggers: []*controlv1.DelegatedTrigger{
		{Trigger: "t", Bucket: "a", Function: "work", Service: "wf-work", Url: cfn.URL},
		{Trigger: "n", Bucket: "b", Key: "k1", Function: "work", Service: "wf-work", Url: cfn.URL},
		{Trigger: "gone", Bucket: "c", Function: "work", Service: "wf-work", Url: dead.URL},
	}}
	// The consumer's stream may be welcomed at any moment: the triggers
	// are handed over under the lock the server's Welcome reads them with.
	ev.mu.Lock()
	ev.deleg = deleg
	ev.mu.Unlock()
	producer := run("p", "entry")
	waitDelegations(t, producer)
	pfn := httptest.NewServer(producer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		_ = json.NewEncoder(w).Encode(invocation.Outputs{Objects: []invocation.Object{
			{Bucket: "a", Key: "k0", Inline: []byte("0")},
			{Bucket: "b", Key: "k1", Inline: []byte("1")},
			{Bucket: "b", Key: "k2", Inline: []byte("2"), FiredLocally: []string{"s1.dforged"}}, // the function's own claim
			{Bucket: "c", Key: "k3", Inline: []byte("3")},
		}})
	})))
	defer pfn.Close()

	invoke := func(inv string) *invocation.Outputs {
		resp, body := post(t, pfn.URL, invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-entry", Session: "s1", Invocation: inv})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		outs, err := invocation.DecodeOutputs(body)
		if err != nil {
			t.Fatal(err)
		}
		return outs
	}
	did := func(trig, key string) string {
		b := map[string]string{"t": "a", "n": "b", "gone": "c"}[trig]
		return engine.DelegatedInvocation("s1", trig, "work", b, key)
	}
	outs := invoke("s1.0")
	fired := map[string][]string{}
	for _, o := range outs.Objects {
		fired[o.Key] = o.FiredLocally
	}
	want := map[string][]string{"k0": {did("t", "k0")}, "k1": {did("n", "k1")}, "k2": nil, "k3": nil}
	for k, w := range want {
		if len(fired[k]) != len(w) || len(w) == 1 && fired[k][0] != w[0] {
			t.Errorf("%s: fired %v, want %v", k, fired[k], w)
		}
	}

	// The consumer's sidecar reports each delegated invocation: its
	// output, then its end with the return value.
	for range 6 {
		select {
		case <-ev.got:
		case <-time.After(time.Minute):
			t.Fatalf("the consumer's sidecar reported %d starts, %d objects and %d ends, want 2, 2 and 2", len(ev.started), len(ev.objects), len(ev.finished))
		}
	}
	ev.mu.Lock()
	for _, st := range ev.started {
		var args invocation.Envelope
		if err := json.Unmarshal(st.Args, &args); err != nil || st.Function != "work" || len(args.Objects) != 1 || args.Objects[0].Path != "" ||
			st.InvocationId != engine.DelegatedInvocation("s1", args.Trigger, "work", args.Objects[0].Bucket, args.Objects[0].Key) {
			t.Errorf("start %v: args %+v %v", st, args, err)
		}
	}
	var ends []string
	for _, f := range ev.finished {
		ends = append(ends, f.InvocationId+" "+f.Function+" "+string(f.ReturnValue))
		if f.Failed || f.OutputsSent != 1 {
			t.Errorf("end %v", f)
		}
	}
	for _, o := range ev.objects {
		if o.Bucket != "out" || o.ProducerFunction != "work" || o.Session != "s1" {
			t.Errorf("object %v", o)
		}
	}
	ev.mu.Unlock()
	sort.Strings(ends)
	wantEnds := []string{did("t", "k0") + " work ret-k0", did("n", "k1") + " work ret-k1"}
	sort.Strings(wantEnds)
	if len(ends) != 2 || ends[0] != wantEnds[0] || ends[1] != wantEnds[1] {
		t.Errorf("ends %v, want %v", ends, wantEnds)
	}
	mu.Lock()
	for _, env := range received {
		if !env.Delegated || env.Session != "s1" || env.Function != "wf-work" || len(env.Objects) != 1 {
			t.Errorf("the consumer received %+v", env)
		}
	}
	if len(received) != 2 {
		t.Errorf("the consumer was invoked %d times, want 2", len(received))
	}
	mu.Unlock()

	// A re-execution fires nothing itself: the engine decides.
	for _, o := range invoke("s1.0.r1").Objects {
		if len(o.FiredLocally) != 0 {
			t.Errorf("a re-execution fired %s/%s itself: %v", o.Bucket, o.Key, o.FiredLocally)
		}
	}

	// The producer's sidecar reported its own invocations' outcomes too:
	// their four objects (with what it fired), then their ends.
	for _, want := range []string{"s1.0", "s1.0.r1"} {
		select {
		case got := <-ev.ownEnds:
			if got != want {
				t.Fatalf("the producer reported the end of %s, want %s", got, want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("the producer's sidecar never reported the end of %s", want)
		}
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var own []string
	for _, l := range ev.own {
		if strings.Contains(l, " s1.0 ") || strings.HasSuffix(l, "s1.0") {
			own = append(own, l)
		}
	}
	if len(own) != 5 || own[4] != "finished s1.0 failed=false outputs=4" {
		t.Errorf("the producer reported %q of its own invocation, want its 4 objects and its end", own)
	}
}

// TestDelegatedFiringGoesStraightToThePushedPods: with direct routing the
// operator sends, with each delegated trigger, its target's ready pods;
// the producer's sidecar sends the invocation straight to one of them,
// and by the trigger's URL (the route) when the pod it picked refuses
// (gone): the invocation is claimed either way, and sent once.
func TestDelegatedFiringGoesStraightToThePushedPods(t *testing.T) {
	ev := &delegEvents{got: make(chan struct{}, 64), ownEnds: make(chan string, 64)}
	addr := controlServer(t, ev)
	consumer := workflowSidecar(t, addr, "c", "work")
	var mu sync.Mutex
	got := map[string][]string{} // path -> invocation ids
	fn := func(path string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var env invocation.Envelope
			_ = json.NewDecoder(r.Body).Decode(&env)
			mu.Lock()
			got[path] = append(got[path], env.Invocation)
			mu.Unlock()
			_, _ = w.Write([]byte("ok"))
		})
	}
	pod := httptest.NewServer(consumer.Wrap(fn("pod")))
	defer pod.Close()
	route := httptest.NewServer(consumer.Wrap(fn("route")))
	defer route.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	podAddr, goneAddr := strings.TrimPrefix(pod.URL, "http://"), strings.TrimPrefix(gone.URL, "http://")
	ev.mu.Lock()
	ev.deleg = &controlv1.Delegations{Triggers: []*controlv1.DelegatedTrigger{
		{Trigger: "t", Bucket: "a", Function: "work", Service: "wf-work", Url: route.URL, Pods: []*controlv1.Pod{{Addr: podAddr}}},
		{Trigger: "u", Bucket: "b", Function: "work", Service: "wf-work", Url: route.URL, Pods: []*controlv1.Pod{{Addr: goneAddr}}},
	}}
	ev.mu.Unlock()
	producer := workflowSidecar(t, addr, "p", "entry")
	waitDelegations(t, producer)
	routes := func() (direct, fallback, url float64) {
		return testutil.ToFloat64(delegatedRequests.WithLabelValues(call.RouteDirect)),
			testutil.ToFloat64(delegatedRequests.WithLabelValues(call.RouteFallback)), testutil.ToFloat64(delegatedRequests.WithLabelValues(call.RouteURL))
	}
	d0, f0, u0 := routes()
	pfn := httptest.NewServer(producer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		_ = json.NewEncoder(w).Encode(invocation.Outputs{Objects: []invocation.Object{
			{Bucket: "a", Key: "k0", Inline: []byte("0")}, {Bucket: "b", Key: "k1", Inline: []byte("1")}}})
	})))
	defer pfn.Close()
	resp, body := post(t, pfn.URL, invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-entry", Session: "s1", Invocation: "s1.0"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	outs, err := invocation.DecodeOutputs(body)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range outs.Objects {
		if len(o.FiredLocally) != 1 {
			t.Errorf("%s/%s: fired %v, want one claim", o.Bucket, o.Key, o.FiredLocally)
		}
	}
	direct, byRoute := engine.DelegatedInvocation("s1", "t", "work", "a", "k0"), engine.DelegatedInvocation("s1", "u", "work", "b", "k1")
	for deadline := time.Now().Add(time.Minute); ; {
		mu.Lock()
		n := len(got["pod"]) + len(got["route"])
		mu.Unlock()
		if n >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	if fmt.Sprint(got["pod"]) != fmt.Sprint([]string{direct}) || fmt.Sprint(got["route"]) != fmt.Sprint([]string{byRoute}) {
		t.Fatalf("the pod got %v, the route %v; want [%s] straight and [%s] by the route (its pod was gone)", got["pod"], got["route"], direct, byRoute)
	}
	mu.Unlock()
	// ziptrail_delegated_requests_total counts each request by its route
	// once its answer is in: one direct, one fallback then by URL.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		d, f, u := routes()
		if d-d0 == 1 && f-f0 == 1 && u-u0 == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ziptrail_delegated_requests_total grew by direct %v, fallback %v, url %v; want 1 each", d-d0, f-f0, u-u0)
		}
	}
}

// waitDelegations waits (a minute at most) until s has its delegated
// triggers from the operator's Welcome.
func waitDelegations(t testing.TB, s *Sidecar) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for s.deleg.byBucket.Load() == nil || len(*s.deleg.byBucket.Load()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the producer's sidecar never got its delegated triggers")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
