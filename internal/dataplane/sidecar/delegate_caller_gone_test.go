package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// endEvents are orderedEvents that also note failed ends.
type endEvents struct {
	orderedEvents
	failed atomic.Int32
}

func (e *endEvents) FunctionFinished(ctx context.Context, id control.Identity, ev *controlv1.FunctionFinished) error {
	if ev.Failed {
		e.failed.Add(1)
	}
	return e.orderedEvents.FunctionFinished(ctx, id, ev)
}

// TestDelegatedInvocationOutlivesItsCaller: the producer's sidecar that
// sent a delegated invocation goes away (its pod is terminated once its
// outputs are safe) while the consumer's function runs. The function is
// behind a reverse proxy, as the user container is behind queue-proxy: it
// is not cancelled, and the consumer's sidecar reports its start, its
// output and a successful end — the engine counts the firing as done, so
// cancelling it would lose the outputs.
func TestDelegatedInvocationOutlivesItsCaller(t *testing.T) {
	ev := &endEvents{}
	addr := controlServer(t, ev)
	s := workflowSidecar(t, addr, "c", "work")
	running := make(chan string, 4)
	release := make(chan struct{})
	var cancelled sync.Map      // invocations whose function saw its request cancelled
	stop := make(chan struct{}) // the test ends: nothing waits on
	user := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // as a function reads its envelope
		inv := r.Header.Get(invocation.HeaderInvocation)
		running <- inv
		select {
		case <-release:
		case <-r.Context().Done():
			cancelled.Store(inv, true)
			return
		case <-stop:
			return
		}
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		_, _ = w.Write([]byte(`{"objects":[{"bucket":"out","key":"o","inline":"eQ=="}],"return":"cg=="}`))
	}))
	defer user.Close()
	defer close(stop)
	target, _ := url.Parse(user.URL)
	fn := httptest.NewServer(s.Wrap(httputil.NewSingleHostReverseProxy(target)))
	defer fn.Close()

	// The caller sends the invocation and goes away while it runs.
	call := func(inv string, delegated bool) {
		body, _ := json.Marshal(invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: inv,
			Delegated: delegated, Objects: []invocation.Object{{Bucket: "in", Key: "k", Inline: []byte("x")}}})
		cctx, ccancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(cctx, http.MethodPost, fn.URL, bytes.NewReader(body))
		req.Header.Set("Content-Type", invocation.ContentType)
		req.Header.Set(invocation.HeaderInvocation, inv)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		select {
		case got := <-running:
			if got != inv {
				t.Fatalf("the function runs %q, want %q", got, inv)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s never reached the function", inv)
		}
		ccancel()
		<-done
	}
	waitFor := func(inv string, want []string) {
		deadline := time.Now().Add(time.Minute)
		for !slices.Equal(ev.of(inv), want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: events %v, want %v", inv, ev.of(inv), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// The delegated invocation's caller goes away (a plain one's too:
	// TestOutcomeOutlivesItsCaller).
	call("s1.dgone", true)
	close(release)
	waitFor("s1.dgone", []string{"started", "object", "finished"})
	if _, ok := cancelled.Load("s1.dgone"); ok {
		t.Fatal("the delegated invocation's function was cancelled with its caller")
	}
	if n := ev.failed.Load(); n != 0 {
		t.Errorf("the delegated invocation was reported failed (%d)", n)
	}
}
