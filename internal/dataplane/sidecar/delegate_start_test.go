package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// orderedEvents records the kind and invocation of every event, in the
// order the control server hands them over.
type orderedEvents struct {
	mu  sync.Mutex
	log []string
}

func (e *orderedEvents) add(kind, inv string) {
	e.mu.Lock()
	e.log = append(e.log, kind+" "+inv)
	e.mu.Unlock()
}
func (e *orderedEvents) ObjectReady(_ context.Context, _ control.Identity, ev *controlv1.ObjectReady) error {
	e.add("object", ev.InvocationId)
	return nil
}
func (e *orderedEvents) FunctionStarted(_ context.Context, _ control.Identity, ev *controlv1.FunctionStarted) error {
	e.add("started", ev.InvocationId)
	return nil
}
func (e *orderedEvents) FunctionFinished(_ context.Context, _ control.Identity, ev *controlv1.FunctionFinished) error {
	e.add("finished", ev.InvocationId)
	return nil
}
func (e *orderedEvents) of(inv string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, l := range e.log {
		if strings.HasSuffix(l, " "+inv) {
			out = append(out, strings.TrimSuffix(l, " "+inv))
		}
	}
	return out
}

// TestDelegatedStartReport: the consumer's sidecar reports a delegated
// invocation's start before its outputs and end, whether the start waited
// for them (a short invocation: one batch) or went out on its own while
// the function still ran (a long one); an invocation that fails before its
// function runs still has its start reported.
func TestDelegatedStartReport(t *testing.T) {
	ev := &orderedEvents{}
	addr := controlServer(t, ev)
	s := workflowSidecar(t, addr, "c", "work")
	release := make(chan struct{})
	fn := httptest.NewServer(s.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(invocation.HeaderInvocation) == "s1.dslow" {
			<-release
		}
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		_, _ = w.Write([]byte(`{"objects":[{"bucket":"out","key":"o","inline":"eQ=="}],"return":"cg=="}`))
	})))
	defer fn.Close()
	send := func(inv string, objs ...invocation.Object) {
		body, _ := json.Marshal(invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: inv,
			Delegated: true, Objects: objs})
		req, _ := http.NewRequest(http.MethodPost, fn.URL, bytes.NewReader(body))
		req.Header.Set("Content-Type", invocation.ContentType)
		req.Header.Set(invocation.HeaderInvocation, inv)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return
		}
		resp.Body.Close()
	}
	wait := func(inv string, n int) []string {
		deadline := time.Now().Add(time.Minute)
		for len(ev.of(inv)) < n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: events %v, want %d", inv, ev.of(inv), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return ev.of(inv)
	}

	for i := range 20 { // short: the start goes with the outcome, or before it
		inv := "s1.dfast" + string(rune('a'+i))
		send(inv)
		if got := strings.Join(wait(inv, 3), ","); got != "started,object,finished" {
			t.Errorf("%s: events %s", inv, got)
		}
	}

	done := make(chan struct{})
	go func() { send("s1.dslow"); close(done) }()
	if got := strings.Join(wait("s1.dslow", 1), ","); got != "started" { // reported while the function runs
		t.Errorf("s1.dslow while running: events %s", got)
	}
	close(release)
	<-done
	if got := strings.Join(wait("s1.dslow", 3), ","); got != "started,object,finished" {
		t.Errorf("s1.dslow: events %s", got)
	}

	// Inputs that cannot be resolved: the function never runs; its start
	// and its failure are reported by this sidecar, which owns the
	// invocation (a failure the producer reported would be refused as
	// another pod's while this one is connected: the session hung until
	// its deadline, e2e/helm "without activator-ext ... expires").
	send("s1.dbad", invocation.Object{Bucket: "in", Key: "k", Ref: "zt1.forged"})
	if got := strings.Join(wait("s1.dbad", 2), ","); got != "started,finished" {
		t.Errorf("s1.dbad: events %s", got)
	}
}

// wireMessages counts, per invocation, the control messages that carried
// its events (an Events message is one), as the server receives them.
type wireMessages struct {
	mu  sync.Mutex
	per map[string]int
}

func (w *wireMessages) interceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &countingStream{ServerStream: ss, w: w})
}

func (w *wireMessages) of(inv string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.per[inv]
}

type countingStream struct {
	grpc.ServerStream
	w *wireMessages
}

func (c *countingStream) RecvMsg(m any) error {
	if err := c.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	msg, ok := m.(*controlv1.SidecarMessage)
	if !ok {
		return nil
	}
	evs := msg.GetEvents().GetEvents()
	if evs == nil {
		evs = []*controlv1.SidecarMessage{msg}
	}
	seen := map[string]bool{}
	for _, ev := range evs {
		inv := ev.GetFunctionStarted().GetInvocationId() + ev.GetObjectReady().GetInvocationId() + ev.GetFunctionFinished().GetInvocationId()
		if inv != "" && !seen[inv] {
			seen[inv] = true
			c.w.mu.Lock()
			c.w.per[inv]++
			c.w.mu.Unlock()
		}
	}
	return nil
}

// TestADelegatedStepIsOneControlMessage: a delegated invocation's start,
// outputs and end reach the operator in one control message (Events),
// when the function answers within the start's hold.
func TestADelegatedStepIsOneControlMessage(t *testing.T) {
	ev := &orderedEvents{}
	wire := &wireMessages{per: map[string]int{}}
	addr := controlServer(t, ev, grpc.ChainStreamInterceptor(wire.interceptor))
	s := workflowSidecar(t, addr, "c", "work", func(c *Config) { c.StartReportHold = time.Minute })
	fn := httptest.NewServer(s.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		_, _ = w.Write([]byte(`{"objects":[{"bucket":"out","key":"o","inline":"eQ=="},{"bucket":"out","key":"p","inline":"eQ=="}],"return":"cg=="}`))
	})))
	defer fn.Close()
	send := func(inv string) {
		body, _ := json.Marshal(invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: inv, Delegated: true})
		req, _ := http.NewRequest(http.MethodPost, fn.URL, bytes.NewReader(body))
		req.Header.Set("Content-Type", invocation.ContentType)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		deadline := time.Now().Add(time.Minute)
		for len(ev.of(inv)) < 4 || s.ctl.Unacked() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: events %v, %d not acknowledged", inv, ev.of(inv), s.ctl.Unacked())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// The first step's events may go before the stream's Features were
	// read; once they are acknowledged, the Features were.
	send("s1.dfirst")
	for i := range 10 {
		inv := "s1.dstep" + string(rune('a'+i))
		send(inv)
		if got, n := strings.Join(ev.of(inv), ","), wire.of(inv); got != "started,object,object,finished" || n != 1 {
			t.Errorf("%s: events %s in %d control messages, want started,object,object,finished in 1", inv, got, n)
		}
	}
}
