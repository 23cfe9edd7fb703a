package orchestrator

import (
	"context"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
	"github.com/ziptrail/ziptrail/internal/invocation/podpick"
)

// readyRouter is direct routing's side for the refresh: every Service has
// one ready pod; it counts the refresh's questions.
type readyRouter struct{ asked atomic.Int64 }

func (r *readyRouter) Pick(*invocation.Envelope, string) (string, func(call.Verdict)) { return "", nil }
func (r *readyRouter) Ready(string, string) []podpick.Pod {
	r.asked.Add(1)
	return []podpick.Pod{{Addr: "10.0.0.1:8012", Node: "n1"}}
}

type urlResolver struct{}

func (urlResolver) URL(_ context.Context, ns, svc string) (*url.URL, error) {
	return &url.URL{Scheme: "http", Host: svc + "." + ns + ".svc"}, nil
}

// TestDelegationsRefreshKeepsNoWorkflowObject: the delegations' refresh
// (every second, on its own goroutine) reads what SetWorkflow was given
// as it was, not the reconciler's Workflow, which the reconciler goes on
// writing (its status, from the API server's answers). Under -race the
// old code, which kept the object, failed here (found by the e2e suite's
// race detector with delegation on by default, issue 33).
func TestDelegationsRefreshKeepsNoWorkflowObject(t *testing.T) {
	router := &readyRouter{}
	o, err := New(Options{Resolver: urlResolver{}, Router: router, Log: logr.Discard(), Delegate: true})
	if err != nil {
		t.Fatal(err)
	}
	wf := testWorkflow("wf", "entry", "entry", "work")
	wf.Namespace = "ns"
	wf.Spec.Triggers = append(wf.Spec.Triggers, immediate("t", "a", "work"))
	if err := o.SetWorkflow(wf, true, ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// The reconciler's writes to its object, while refreshes run.
	asked := router.asked.Load()
	for deadline := time.Now().Add(time.Minute); router.asked.Load() < asked+2; {
		if time.Now().After(deadline) {
			t.Fatal("the delegations were not refreshed twice within a minute")
		}
		wf.Name, wf.Namespace = "wf", "ns" // a decode writes the fields again
		wf.Status.ObservedGeneration++
		time.Sleep(time.Millisecond)
	}
	o.deleg.mu.RLock()
	src, ok := o.deleg.src[Key("ns", "wf")]
	o.deleg.mu.RUnlock()
	if !ok || src.namespace != "ns" || src.name != "wf" {
		t.Fatalf("the refresh's source: %+v, %v", src, ok)
	}
}
