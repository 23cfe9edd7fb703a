package sidecar

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// forgingFunction answers with outputs and a HeaderOutcomeKept of its own,
// or fails for invocation ids ending in "fail".
type forgingFunction struct{ countingFunction }

func (f *forgingFunction) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(invocation.HeaderOutcomeKept, "victim/1")
	f.countingFunction.ServeHTTP(w, r)
}

// The report of an invocation whose caller asks for it to be kept (the
// operator's dispatcher, which releases it once it saved the answer) is
// kept, and its answer names it; any other caller's, and a failure, are
// reported at once. A function cannot name a kept report: the header is
// the sidecar's.
func TestOnlyTheDispatchersAnswersNameAKeptReport(t *testing.T) {
	ev := &endsEvents{ends: make(chan *controlv1.FunctionFinished, 16)}
	s := workflowSidecar(t, controlServer(t, ev), "p", "work")
	u := behindProxy(t, s, &forgingFunction{countingFunction{runs: map[string]int{}}})
	call := func(inv string, keep bool) *http.Response {
		t.Helper()
		env := invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: inv,
			Objects: []invocation.Object{{Bucket: "in", Key: "k", Inline: []byte("x")}}}
		data, _ := json.Marshal(env)
		req, _ := http.NewRequest(http.MethodPost, u, bytes.NewReader(data))
		req.Header.Set("Content-Type", invocation.ContentType)
		if keep {
			req.Header.Set(invocation.HeaderKeepReport, "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp
	}
	nextEnd := func() string {
		t.Helper()
		select {
		case f := <-ev.ends:
			return f.InvocationId
		case <-time.After(time.Minute):
			t.Fatal("no outcome reported")
			return ""
		}
	}

	kept := call("s1.0", true)
	if pod, id, ok := invocation.ParseKept(kept.Header); !ok || pod != "p" || id == 1 {
		t.Fatalf("the dispatcher's answer names %q, want a report kept by pod p", kept.Header.Get(invocation.HeaderOutcomeKept))
	}
	if n := s.ctl.Kept(); n != 1 {
		t.Fatalf("%d reports kept, want 1", n)
	}
	plain := call("s1.1", false)
	if v := plain.Header.Get(invocation.HeaderOutcomeKept); v != "" {
		t.Fatalf("an answer to a caller that asked for nothing names %q (the function's forgery passed through)", v)
	}
	if id := nextEnd(); id != "s1.1" {
		t.Fatalf("the first outcome reported is %s's, want s1.1's (s1.0's is kept)", id)
	}
	failed := call("s1.fail", true)
	if failed.StatusCode != http.StatusInternalServerError {
		t.Fatalf("the failing function answered %d", failed.StatusCode)
	}
	if _, _, ok := invocation.ParseKept(failed.Header); ok && s.ctl.Kept() != 2 {
		t.Fatalf("a failure's answer names a kept report %q that is not kept", failed.Header.Get(invocation.HeaderOutcomeKept))
	}
}
