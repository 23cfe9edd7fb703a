package orchestrator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// limitsEnv is a real API server (tokens, TokenReview, Workflows, Events),
// the operator's control server authenticating sidecars with their pod
// tokens, and an orchestrator with limits behind it, recording Kubernetes
// Events as the operator does. Namespaces team-a and team-b each have the
// workflow "acc": entry returns nothing (its session runs until its
// deadline or an object in "out"), and bucket "acc" accumulates objects
// (a batch of 100,000 for "sink").
type limitsEnv struct {
	*delegEnv
	wfs  map[string]*v1alpha1.Workflow // by namespace
	logs chan error                    // what the control server logged
}

func newLimitsEnv(t *testing.T, lim Limits, inputs *Inputs) *limitsEnv {
	t.Helper()
	ctrllog.SetLogger(logr.Discard())
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	e := &limitsEnv{delegEnv: &delegEnv{t: t}, wfs: map[string]*v1alpha1.Workflow{}, logs: make(chan error, 1024)}
	if e.k8s, err = client.New(env.Config, client.Options{Scheme: envtest.Scheme()}); err != nil {
		t.Fatal(err)
	}
	if e.kube, err = kubernetes.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// The operator's Event recorder (mgr.GetEventRecorder).
	bc := events.NewBroadcaster(&events.EventSinkImpl{Interface: e.kube.EventsV1()})
	bc.StartRecordingToSink(ctx.Done())
	rec := bc.NewRecorder(envtest.Scheme(), "ziptrail-limits")

	fns := &servers.Functions{}
	fns.Add(t, "acc-entry", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})) // sends nothing
	fns.Add(t, "acc-sink", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	if e.o, err = New(Options{Resolver: fns, Log: logr.Discard(), Limits: lim, Inputs: inputs,
		LimitEvents: &LimitEvents{Recorder: rec, Reader: e.k8s}}); err != nil {
		t.Fatal(err)
	}
	srv := control.NewServer(e.o, &control.SecretKeys{Client: e.k8s})
	srv.Auth = &control.TokenReviewer{Client: e.k8s}
	srv.Log = func(err error) {
		select {
		case e.logs <- err:
		default:
		}
	}
	e.o.SetControl(srv)
	for _, ns := range []string{"team-a", "team-b"} {
		if err := e.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
		wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "acc"}, Spec: v1alpha1.WorkflowSpec{
			Entry: "entry", OutputBucket: "out", SessionDeadline: &metav1.Duration{Duration: time.Minute},
			Functions: []v1alpha1.FunctionSpec{{Name: "entry", Image: "example.com/entry"}, {Name: "sink", Image: "example.com/sink"}},
			Triggers: []v1alpha1.NamedTrigger{{Name: "acc", Spec: v1alpha1.TriggerSpec{Bucket: "acc", Primitive: v1alpha1.ByBatchSize,
				Targets: []string{"sink"}, ByBatchSize: &v1alpha1.ByBatchSizeParams{Size: 100_000}}}},
		}}
		if err := e.k8s.Create(ctx, wf); err != nil {
			t.Fatal(err)
		}
		if err := e.o.SetWorkflow(wf, true, ""); err != nil {
			t.Fatal(err)
		}
		e.wfs[ns] = wf
	}
	done := make(chan error, 1)
	go func() { done <- e.o.Run(ctx) }()
	gs := grpc.NewServer()
	controlv1.RegisterControlServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		gs.Stop()
		bc.Shutdown()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	e.cl = controlv1.NewControlClient(cc)
	return e
}

// refusedCount reads ziptrail_limits_refused_total{limit,namespace}.
func refusedCount(t *testing.T, limit, namespace string) float64 {
	t.Helper()
	return metricValue(t, "ziptrail_limits_refused_total", map[string]string{"limit": limit, "namespace": namespace})
}

func metricValue(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// limitEvent waits (10 s at most) for a LimitReached Event on the
// namespace's workflow whose note says all of words.
func (e *limitsEnv) limitEvent(t *testing.T, ns string, words ...string) *eventsv1.Event {
	t.Helper()
	wf := e.wfs[ns]
	deadline := time.Now().Add(10 * time.Second)
	var seen []string
	for time.Now().Before(deadline) {
		list, err := e.kube.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seen = seen[:0]
	events:
		for i, ev := range list.Items {
			seen = append(seen, ev.Reason+": "+ev.Note)
			if ev.Reason != ReasonLimitReached || ev.Regarding.Kind != "Workflow" || ev.Regarding.Name != wf.Name || ev.Regarding.UID != wf.UID ||
				ev.Type != corev1.EventTypeWarning {
				continue
			}
			for _, w := range words {
				if !strings.Contains(ev.Note, w) {
					continue events
				}
			}
			return &list.Items[i]
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no LimitReached Event on workflow %s/%s saying %q; events: %q", ns, wf.Name, words, seen)
	return nil
}

// TestLimitSessionsPerNamespace: a namespace at its running sessions'
// limit gets a start refused with an error naming the limit (the gateway's
// 429), counted and recorded as an Event on the workflow; the refused
// session leaves no trace; another namespace starts as before.
func TestLimitSessionsPerNamespace(t *testing.T) {
	e := newLimitsEnv(t, Limits{SessionsPerNamespace: 2}, nil)
	ctx := context.Background()
	for range 2 {
		if _, err := e.o.StartSession(ctx, "team-a", "acc", []byte("in")); err != nil {
			t.Fatal(err)
		}
	}
	before := refusedCount(t, "sessionsPerNamespace", "team-a")
	_, err := e.o.StartSession(ctx, "team-a", "acc", []byte("in"))
	var le *gateway.LimitError
	if !errors.Is(err, gateway.ErrLimit) || !errors.As(err, &le) || le.Limit != "sessionsPerNamespace" {
		t.Fatalf("third start: %v, want a gateway.LimitError of sessionsPerNamespace", err)
	}
	if want := "namespace team-a has 2 running sessions, the limit sessionsPerNamespace is 2"; err.Error() != want {
		t.Errorf("refusal %q, want %q", err, want)
	}
	if got := refusedCount(t, "sessionsPerNamespace", "team-a") - before; got != 1 {
		t.Errorf("ziptrail_limits_refused_total{limit=sessionsPerNamespace,namespace=team-a} grew by %v, want 1", got)
	}
	if n := len(e.o.Sessions().List("team-a", "")); n != 2 {
		t.Errorf("namespace team-a lists %d sessions, want the 2 running (the refused one never ran)", n)
	}
	e.limitEvent(t, "team-a", "sessionsPerNamespace", "team-a has 2 running sessions")
	if _, err := e.o.StartSession(ctx, "team-b", "acc", []byte("in")); err != nil {
		t.Fatalf("namespace team-b could not start: %v", err)
	}
}

// TestLimitObjectsFromSidecars: sidecars report objects over the control
// stream with their real pod tokens. A session whose sidecar reports more
// than it may hold fails with an error naming the limit, its objects are
// given back, the event is counted as rejected, and an Event is recorded;
// a namespace's sessions together cannot pass the namespace's bound; the
// other namespace's session meanwhile takes its objects and completes.
func TestLimitObjectsFromSidecars(t *testing.T) {
	e := newLimitsEnv(t, Limits{ObjectsPerSession: 20, ObjectsPerNamespace: 30}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := e.sidecar(ctx, "team-a", "acc-entry-a", "acc")
	b := e.sidecar(ctx, "team-b", "acc-entry-b", "acc")
	sa, err := e.o.StartSession(ctx, "team-a", "acc", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := e.o.StartSession(ctx, "team-b", "acc", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	put := func(s *fakeSidecar, session, bucket, key string) {
		t.Helper()
		if rej, _ := s.report(&controlv1.ObjectReady{Session: session, Bucket: bucket, Key: key, Inline: []byte(key),
			ProducerFunction: "entry"}); rej != nil {
			t.Fatalf("object %s/%s of session %s refused: %v", bucket, key, session, rej)
		}
	}
	rejectedBefore := metricValue(t, "ziptrail_control_event_errors_total", nil)
	before := refusedCount(t, "objectsPerSession", "team-a")
	for i := range 25 { // the input is the session's first object: the 20th report is one too many
		put(a, sa, "acc", fmt.Sprint(i))
		if i%5 == 0 {
			put(b, sb, "acc", fmt.Sprint(i)) // team-b reports all along
		}
	}
	s, err := e.o.Sessions().Get(sa)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != sessions.Failed || !strings.Contains(s.Error, "the limit objectsPerSession is 20") || !strings.Contains(s.Error, sa) {
		t.Fatalf("session %s: %s %q, want it failed naming objectsPerSession", sa, s.State, s.Error)
	}
	if got := refusedCount(t, "objectsPerSession", "team-a") - before; got != 1 {
		t.Errorf("ziptrail_limits_refused_total{objectsPerSession,team-a} grew by %v, want 1 (the session fails once; later reports are ignored)", got)
	}
	if got := metricValue(t, "ziptrail_control_event_errors_total", nil) - rejectedBefore; got != 1 {
		t.Errorf("the control server counted %v rejected events, want 1 (the report that failed the session)", got)
	}
	select {
	case err := <-e.logs:
		if !strings.Contains(err.Error(), "objectsPerSession") {
			t.Errorf("the control server logged %v", err)
		}
	default:
		t.Error("the control server logged nothing about the refused report")
	}
	if u := e.o.Engine().Pool().Usage("team-a"); u.Objects != 0 || u.Sessions != 0 {
		t.Errorf("namespace team-a still holds %+v in the engine after its session failed", u)
	}
	e.limitEvent(t, "team-a", "objectsPerSession", sa)

	// The namespace's bound: sessions of team-a, 16 objects each, cannot
	// hold more than 30 together.
	nsBefore := refusedCount(t, "objectsPerNamespace", "team-a")
	var ids []string
	for range 3 {
		id, err := e.o.StartSession(ctx, "team-a", "acc", []byte("in"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		for i := range 15 {
			put(a, id, "acc", fmt.Sprint(i))
			if u := e.o.Engine().Pool().Usage("team-a"); u.Objects > 30 {
				t.Fatalf("namespace team-a holds %d objects, over its bound of 30", u.Objects)
			}
		}
	}
	if got := refusedCount(t, "objectsPerNamespace", "team-a") - nsBefore; got < 1 {
		t.Errorf("no session was refused by objectsPerNamespace")
	}
	failed := 0
	for _, id := range ids {
		if s, _ := e.o.Sessions().Get(id); s.State == sessions.Failed {
			if !strings.Contains(s.Error, "objectsPerNamespace") || !strings.Contains(s.Error, "namespace team-a holds") {
				t.Errorf("session %s failed with %q", id, s.Error)
			}
			failed++
		}
	}
	if failed == 0 {
		t.Error("every session of team-a kept its 16 objects: 48 > 30")
	}
	e.limitEvent(t, "team-a", "objectsPerNamespace", "namespace team-a holds")

	// team-b was not touched: its session completes.
	put(b, sb, "out", "result")
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if s, err := e.o.Sessions().Wait(wctx, sb); err != nil || s.State != sessions.Completed {
		t.Fatalf("namespace team-b's session: %s %q, %v; want it completed", s.State, s.Error, err)
	}
}

// TestLimitInputBytesPerNamespace: one namespace's inputs cannot take the
// whole input store: past its share, its starts are refused naming the
// limit (429) while another namespace still starts with a large input.
func TestLimitInputBytesPerNamespace(t *testing.T) {
	inputs := NewInputs(InputsOptions{Keys: fixedKeys{}, Addr: "127.0.0.1:1", Cap: 1 << 20, PerNamespace: 300 << 10})
	e := newLimitsEnv(t, Limits{InputBytesPerNamespace: 300 << 10}, inputs)
	ctx := context.Background()
	big := bytes.Repeat([]byte("x"), 200<<10)
	if _, err := e.o.StartSession(ctx, "team-a", "acc", big); err != nil {
		t.Fatal(err)
	}
	before := refusedCount(t, "inputBytesPerNamespace", "team-a")
	_, err := e.o.StartSession(ctx, "team-a", "acc", big)
	var le *gateway.LimitError
	if !errors.As(err, &le) || le.Limit != "inputBytesPerNamespace" || !strings.Contains(err.Error(), "namespace team-a holds 204800 bytes") ||
		!strings.Contains(err.Error(), "the limit inputBytesPerNamespace is 307200") {
		t.Fatalf("second large input of team-a: %v, want inputBytesPerNamespace refused", err)
	}
	if got := refusedCount(t, "inputBytesPerNamespace", "team-a") - before; got != 1 {
		t.Errorf("refusals counted: %v, want 1", got)
	}
	if n := len(e.o.Sessions().List("team-a", "")); n != 1 {
		t.Errorf("team-a lists %d sessions, want 1", n)
	}
	if _, err := e.o.StartSession(ctx, "team-b", "acc", big); err != nil {
		t.Fatalf("namespace team-b's large input was refused: %v", err)
	}
	if got := inputs.UsedBy("team-a"); got != 200<<10 {
		t.Errorf("team-a holds %d bytes of inputs, want its one input's %d", got, 200<<10)
	}
	e.limitEvent(t, "team-a", "inputBytesPerNamespace")
}
