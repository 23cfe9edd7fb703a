package orchestrator

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// The tests of this file run sessions through a real orchestrator and
// dispatcher against functions served by real HTTP servers (the Go SDK's
// function handler), without Knative: where issue 15 found outputs lost or
// sessions left running.

// testWorkflow is a workflow of namespace "ns" with a short deadline, so a
// session that would hang expires and the test reports how it ended.
func testWorkflow(name, entry string, fns ...string) *v1alpha1.Workflow {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1alpha1.WorkflowSpec{Entry: entry, SessionDeadline: &metav1.Duration{Duration: 10 * time.Second}}}
	for _, f := range fns {
		wf.Spec.Functions = append(wf.Spec.Functions, v1alpha1.FunctionSpec{Name: f})
	}
	return wf
}

func immediate(name, bucket, target string) v1alpha1.NamedTrigger {
	return v1alpha1.NamedTrigger{Name: name, Spec: v1alpha1.TriggerSpec{Bucket: bucket, Primitive: v1alpha1.Immediate, Targets: []string{target}}}
}

// runWorkflow starts an orchestrator with wf loaded and ready.
func runWorkflow(t *testing.T, wf *v1alpha1.Workflow, fns *servers.Functions) *Orchestrator {
	t.Helper()
	o, err := New(Options{Resolver: fns, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.SetWorkflow(wf, true, ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return o
}

// session runs one session and returns how it ended, with its result.
func session(t *testing.T, o *Orchestrator, wf *v1alpha1.Workflow, input string) (sessions.Session, string) {
	t.Helper()
	id, err := o.StartSession(context.Background(), wf.Namespace, wf.Name, []byte(input))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := o.Sessions().Wait(ctx, id)
	if err != nil {
		t.Fatalf("session %s did not end: %v", id, err)
	}
	if s.State != sessions.Completed {
		return s, ""
	}
	r, err := Results{}.OpenResult(ctx, wf.Namespace, s.Result)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(r)
	return s, string(data)
}

// sendAll sends objects (bucket, key, data triples) from a handler.
func sendAll(ctx context.Context, triples ...string) error {
	for i := 0; i+2 < len(triples); i += 3 {
		if err := ziptrail.SendObject(ctx, triples[i], triples[i+1], []byte(triples[i+2]), nil); err != nil {
			return err
		}
	}
	return nil
}

func inputs(inv *ziptrail.Invocation) []string {
	var out []string
	for _, o := range inv.Objects {
		out = append(out, string(o.Bytes()))
	}
	sort.Strings(out)
	return out
}

// Issue 15, item 6: return values of a function invoked several times are
// each passed on.
func TestDependencyOutputsAreNotLost(t *testing.T) {
	t.Run("Direct fan-in from a source invoked twice", func(t *testing.T) {
		wf := testWorkflow("fanin", "split", "split", "double", "extra", "join")
		wf.Spec.Triggers = []v1alpha1.NamedTrigger{immediate("to-double", "parts", "double"), immediate("to-extra", "side", "extra")}
		wf.Spec.Dependencies = []v1alpha1.Dependency{{From: []string{"double", "extra"}, To: []string{"join"}}}
		fns := &servers.Functions{}
		fns.Add(t, "fanin-split", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
			return nil, sendAll(ctx, "parts", "p1", "p1", "parts", "p2", "p2", "side", "x", "x")
		}))
		fns.Add(t, "fanin-double", ziptrail.FunctionHandler(func(_ context.Context, inv *ziptrail.Invocation) ([]byte, error) {
			return append(inv.Objects[0].Bytes(), '!'), nil
		}))
		fns.Add(t, "fanin-extra", ziptrail.FunctionHandler(func(_ context.Context, inv *ziptrail.Invocation) ([]byte, error) {
			return append(inv.Objects[0].Bytes(), '?'), nil
		}))
		fns.Add(t, "fanin-join", ziptrail.FunctionHandler(func(_ context.Context, inv *ziptrail.Invocation) ([]byte, error) {
			return []byte(strings.Join(inputs(inv), "+")), nil
		}))
		o := runWorkflow(t, wf, fns)
		s, result := session(t, o, wf, "in")
		if s.State != sessions.Completed || result != "p1!+p2!+x?" {
			t.Fatalf("session %s %s (%s): result %q, want every source output p1!+p2!+x?", s.ID, s.State, s.Error, result)
		}
	})

	t.Run("Periodic from a source invoked three times", func(t *testing.T) {
		wf := testWorkflow("periodic", "split", "split", "tick", "agg")
		wf.Spec.Triggers = []v1alpha1.NamedTrigger{immediate("to-tick", "ticks", "tick")}
		period := &metav1.Duration{Duration: 50 * time.Millisecond}
		wf.Spec.Dependencies = []v1alpha1.Dependency{
			{From: []string{"tick"}, To: []string{"agg"}, Type: v1alpha1.DependencyPeriodic, Period: period},
			{From: []string{"agg"}, To: []string{"agg"}, Type: v1alpha1.DependencyPeriodic, Period: period},
		}
		fns := &servers.Functions{}
		fns.Add(t, "periodic-split", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
			return nil, sendAll(ctx, "ticks", "t1", "t1", "ticks", "t2", "t2", "ticks", "t3", "t3")
		}))
		fns.Add(t, "periodic-tick", ziptrail.FunctionHandler(func(_ context.Context, inv *ziptrail.Invocation) ([]byte, error) {
			return inv.Objects[0].Bytes(), nil
		}))
		var mu sync.Mutex
		seen := map[string]bool{}
		fns.Add(t, "periodic-agg", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, o := range inv.Objects {
				if strings.HasPrefix(o.Key, "tick") {
					seen[string(o.Bytes())] = true
				}
			}
			if len(seen) == 3 {
				return nil, ziptrail.SendObject(ctx, "output", "result", []byte("all three"), nil)
			}
			return nil, nil
		}))
		o := runWorkflow(t, wf, fns)
		s, result := session(t, o, wf, "in")
		if s.State != sessions.Completed || result != "all three" {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("session %s %s (%s): the Periodic dependency passed %v, want t1, t2 and t3", s.ID, s.State, s.Error, seen)
		}
	})
}

// Issue 15, item 8: a failure no re-execution rule covers ends the session
// in the engine too, with its reason.
func TestFailuresEndTheSession(t *testing.T) {
	t.Run("a function fails", func(t *testing.T) {
		wf := testWorkflow("fails", "split", "split", "boom", "slow")
		wf.Spec.Triggers = []v1alpha1.NamedTrigger{immediate("to-boom", "a", "boom"), immediate("to-slow", "b", "slow")}
		fns := &servers.Functions{}
		release := make(chan struct{})
		defer close(release)
		fns.Add(t, "fails-split", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
			return nil, sendAll(ctx, "a", "k", "x", "b", "k", "y")
		}))
		fns.Add(t, "fails-boom", ziptrail.FunctionHandler(func(context.Context, *ziptrail.Invocation) ([]byte, error) {
			return nil, errors.New("disk on fire")
		}))
		fns.Add(t, "fails-slow", ziptrail.FunctionHandler(func(context.Context, *ziptrail.Invocation) ([]byte, error) {
			<-release
			return nil, nil
		}))
		o := runWorkflow(t, wf, fns)
		s, _ := session(t, o, wf, "in")
		if s.State != sessions.Failed || !strings.Contains(s.Error, "boom") || !strings.Contains(s.Error, "disk on fire") {
			t.Fatalf("session %s %s: %q, want Failed naming boom and its error", s.ID, s.State, s.Error)
		}
		if n := o.Engine().Sessions(); n != 0 {
			t.Fatalf("the failed session still runs in the engine (%d sessions): its objects are kept and its other branches still fire", n)
		}
	})

	t.Run("a function answers with undecodable outputs", func(t *testing.T) {
		wf := testWorkflow("garbled", "bad", "bad")
		fns := &servers.Functions{}
		fns.Add(t, "garbled-bad", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", invocation.OutputsContentType)
			_, _ = io.WriteString(w, `{"objects": [{"bucket": 7`)
		}))
		o := runWorkflow(t, wf, fns)
		s, _ := session(t, o, wf, "in")
		if s.State != sessions.Failed || !strings.Contains(s.Error, "malformed outputs") {
			t.Fatalf("session %s %s: %q, want Failed with the decoding error", s.ID, s.State, s.Error)
		}
		if n := o.Engine().Sessions(); n != 0 {
			t.Fatalf("%d sessions still in the engine", n)
		}
	})
}

// Issue 15, items 7 and 9: a re-executed DynamicGroup target gets its group
// and its objects back, an empty object included.
func TestRerunKeepsGroupAndEmptyObjects(t *testing.T) {
	for _, tc := range []struct {
		name    string
		objects []string // bucket, key, data triples the splitter sends (group g1)
		want    string
	}{
		{"the group", []string{"x", "data"}, "g1:x=data"},
		{"an empty object", []string{"x", "data", "e", ""}, "g1:e=,x=data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wf := testWorkflow("rerun", "split", "split", "reduce", "fin")
			wf.Spec.Triggers = []v1alpha1.NamedTrigger{
				{Name: "grp", Spec: v1alpha1.TriggerSpec{Bucket: "shuffle", Primitive: v1alpha1.DynamicGroup, Targets: []string{"reduce"},
					DynamicGroup: &v1alpha1.DynamicGroupParams{GroupMetadataKey: "group", Sources: []string{"split"}}}},
				{Name: "done", Spec: v1alpha1.TriggerSpec{Bucket: "res", Primitive: v1alpha1.Immediate, Targets: []string{"fin"},
					// reduce's first output gets lost: it is re-executed.
					Reexecution: []v1alpha1.ReexecutionRule{{SourceFunction: "reduce", Timeout: metav1.Duration{Duration: 200 * time.Millisecond}, MaxAttempts: 2}}}},
			}
			fns := &servers.Functions{}
			fns.Add(t, "rerun-split", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
				for i := 0; i+1 < len(tc.objects); i += 2 {
					if err := ziptrail.SendObject(ctx, "shuffle", tc.objects[i], []byte(tc.objects[i+1]), map[string]string{"group": "g1"}); err != nil {
						return nil, err
					}
				}
				return nil, nil
			}))
			fns.Add(t, "rerun-reduce", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
				if inv.Attempt == 0 {
					return nil, nil // the output that never arrives
				}
				var parts []string
				for _, o := range inv.Objects {
					parts = append(parts, o.Key+"="+string(o.Bytes()))
				}
				sort.Strings(parts)
				return nil, ziptrail.SendObject(ctx, "res", "r", []byte(inv.Group+":"+strings.Join(parts, ",")), nil)
			}))
			fns.Add(t, "rerun-fin", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
				return nil, ziptrail.SendObject(ctx, "output", "result", inv.Objects[0].Bytes(), nil)
			}))
			o := runWorkflow(t, wf, fns)
			s, result := session(t, o, wf, "in")
			if s.State != sessions.Completed || result != tc.want {
				t.Fatalf("session %s %s (%s): result %q, want %q", s.ID, s.State, s.Error, result, tc.want)
			}
		})
	}
}

// Issue 15, item 10: an output a mapper sent through its sidecar, reported
// over the control stream after the mapper's response, still reaches its
// group: the response said how many outputs the sidecar sent.
func TestLateSidecarOutputReachesItsGroup(t *testing.T) {
	wf := testWorkflow("late", "split", "split", "map", "reduce")
	wf.Spec.Triggers = []v1alpha1.NamedTrigger{
		immediate("to-map", "chunks", "map"),
		{Name: "grp", Spec: v1alpha1.TriggerSpec{Bucket: "shuffle", Primitive: v1alpha1.DynamicGroup, Targets: []string{"reduce"},
			DynamicGroup: &v1alpha1.DynamicGroupParams{Sources: []string{"map"}}}},
	}
	fns := &servers.Functions{}
	fns.Add(t, "late-split", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
		return nil, sendAll(ctx, "chunks", "c1", "c1")
	}))
	mapInv := make(chan string, 1)
	mapper := ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		mapInv <- inv.ID
		return nil, ziptrail.SendObject(ctx, "shuffle", "a", []byte("a"), map[string]string{"group": "g"})
	})
	fns.Add(t, "late-map", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// What the mapper's sidecar adds: it sent one more output (b).
		w.Header().Set(invocation.HeaderOutputsSent, "1")
		mapper.ServeHTTP(w, r)
	}))
	fns.Add(t, "late-reduce", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		return nil, ziptrail.SendObject(ctx, "output", "result", []byte(strings.Join(inputs(inv), ",")), nil)
	}))
	o := runWorkflow(t, wf, fns)
	id, err := o.StartSession(context.Background(), "ns", "late", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	inv := <-mapInv
	waitFor(t, "the mapper's finish", func() bool {
		for _, ss := range o.Engine().Snapshot().Sessions {
			if st := ss.Invocations[inv]; ss.ID == id && st != nil && st.Finished {
				return true
			}
		}
		s, _ := o.Sessions().Get(id)
		return s.State.Ended() // the old engine: the group fired and the session completed
	})
	// The sidecar's report of b arrives over the control stream.
	err = o.ObjectReady(context.Background(), control.Identity{Namespace: "ns", Workflow: "late", Function: "map", Pod: "late-map-1"},
		&controlv1.ObjectReady{Session: id, Bucket: "shuffle", Key: "b", Size: 1, Inline: []byte("b"), Metadata: map[string]string{"group": "g"},
			ProducerFunction: "map", InvocationId: inv})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := o.Sessions().Wait(ctx, id)
	if err != nil || s.State != sessions.Completed {
		t.Fatalf("session %s %s (%v %s)", id, s.State, err, s.Error)
	}
	r, _ := Results{}.OpenResult(ctx, "ns", s.Result)
	got, _ := io.ReadAll(r)
	if string(got) != "a,b" {
		t.Fatalf("the group passed %q, want both outputs a,b", got)
	}
}
