package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// ringEvents is the engine's side for BenchmarkDelegatedStep: it takes
// every report and welcomes each pod with the ring's delegations.
type ringEvents struct{ deleg *controlv1.Delegations }

func (*ringEvents) ObjectReady(context.Context, control.Identity, *controlv1.ObjectReady) error {
	return nil
}
func (*ringEvents) FunctionStarted(context.Context, control.Identity, *controlv1.FunctionStarted) error {
	return nil
}
func (*ringEvents) FunctionFinished(context.Context, control.Identity, *controlv1.FunctionFinished) error {
	return nil
}
func (e *ringEvents) Welcome(control.Identity) []*controlv1.OperatorMessage {
	return []*controlv1.OperatorMessage{{Msg: &controlv1.OperatorMessage_Delegations{Delegations: e.deleg}}}
}

// BenchmarkDelegatedStep: a session going around a ring of 4 pods (each a
// sidecar before a Go function, over real HTTP on loopback, with a real
// control server), each step fired by the producer's sidecar straight to
// the next pod (delegated firing, pods pushed): ns/step. Beside it, in the
// same run, one invocation through a sidecar ("invoke", what a step
// cannot go below: a request through the consumer's sidecar, its outcome
// reported) and one straight to the function ("floor"). Knative's
// queue-proxy, the activator and the engine are not in it (issue 33: what
// a delegated step adds over one invocation, measured without them).
func BenchmarkDelegatedStep(b *testing.B) {
	const pods, steps = 4, 20
	ev := &ringEvents{}
	addr := controlServer(b, ev)
	done := make(chan string, 1)
	fn := func(i int) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var env invocation.Envelope
			if err := json.NewDecoder(r.Body).Decode(&env); err != nil || len(env.Objects) == 0 {
				_, _ = w.Write([]byte("ok")) // the floor's and invoke's requests
				return
			}
			left, _ := strconv.Atoi(strings.TrimPrefix(env.Objects[0].Key, "k"))
			if left == 0 {
				done <- env.Session
				_, _ = w.Write([]byte("ok"))
				return
			}
			w.Header().Set("Content-Type", invocation.OutputsContentType)
			_ = json.NewEncoder(w).Encode(invocation.Outputs{Objects: []invocation.Object{
				{Bucket: fmt.Sprintf("b%d", (i+1)%pods), Key: fmt.Sprintf("k%d", left-1), Inline: []byte("x")}}})
		})
	}
	// The pods' addresses first: the delegations name them, and each
	// sidecar reads them when its stream starts (the Welcome).
	srvs := make([]*httptest.Server, pods)
	handlers := make([]http.Handler, pods)
	deleg := &controlv1.Delegations{}
	for i := range pods {
		srvs[i] = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handlers[i].ServeHTTP(w, r) }))
		b.Cleanup(srvs[i].Close)
		a := srvs[i].Listener.Addr().String()
		deleg.Triggers = append(deleg.Triggers, &controlv1.DelegatedTrigger{Trigger: fmt.Sprintf("t%d", i), Bucket: fmt.Sprintf("b%d", i),
			Function: fmt.Sprintf("f%d", i), Service: fmt.Sprintf("wf-f%d", i), Url: "http://" + a, Pods: []*controlv1.Pod{{Addr: a}}})
	}
	ev.deleg = deleg
	for i := range pods {
		s := workflowSidecar(b, addr, fmt.Sprintf("p%d", i), fmt.Sprintf("f%d", i))
		waitDelegations(b, s)
		handlers[i] = s.Wrap(fn(i))
		srvs[i].Start()
	}
	plain := httptest.NewServer(fn(0))
	defer plain.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	defer client.CloseIdleConnections()
	// Ids of their own in every run of a sub-benchmark (each runs more
	// than once): a repeated one would be answered from the sidecar's
	// idempotency record, without the function, and fire nothing.
	run, seq := time.Now().UnixNano(), 0
	next := func() int { seq++; return seq }
	b.Run("floor", func(b *testing.B) {
		for b.Loop() {
			postEnvelope(b, client, plain.URL, invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-f0", Session: "s", Invocation: fmt.Sprintf("s.f%d.%d", run, next())}, false)
		}
	})
	b.Run("invoke", func(b *testing.B) {
		for b.Loop() {
			postEnvelope(b, client, srvs[1].URL, invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-f1", Session: "s", Invocation: fmt.Sprintf("s.i%d.%d", run, next())}, false)
		}
	})
	b.Run("step", func(b *testing.B) {
		for b.Loop() {
			session := fmt.Sprintf("r%d-%d", run, next())
			postEnvelope(b, client, srvs[0].URL, invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-f0", Session: session,
				Invocation: session + ".0", Objects: []invocation.Object{{Bucket: "in", Key: fmt.Sprintf("k%d", steps), Inline: []byte("x")}}}, false)
			select {
			case got := <-done:
				if got != session {
					b.Fatalf("session %s ended, want %s", got, session)
				}
			case <-time.After(time.Minute):
				b.Fatalf("session %s did not go around the ring", session)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/steps, "ns/step")
	})
}
