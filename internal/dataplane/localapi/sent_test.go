package localapi

import (
	"context"
	"net/http"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// An empty object sent through the sidecar is reported as an object with
// empty contents, and stays one on the wire to the operator (issue 15,
// item 7): without it the operator refused the report and the session hung.
func TestEmptyObjectIsReportedAsOne(t *testing.T) {
	a := startPod(t, podOpts{})
	if _, err := a.sdk.SendObject(context.Background(), "s1", "b", "empty", nil, false); err != nil {
		t.Fatal(err)
	}
	ev := <-a.events
	wire, err := proto.Marshal(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: ev}})
	if err != nil {
		t.Fatal(err)
	}
	var got controlv1.SidecarMessage
	if err := proto.Unmarshal(wire, &got); err != nil {
		t.Fatal(err)
	}
	if o := got.GetObjectReady(); o.Ref != "" || o.Inline == nil || len(o.Inline) != 0 {
		t.Fatalf("the operator receives %+v: neither a reference nor contents", o)
	}
}

// The sidecar counts what each invocation sent through the local API, for
// the invocation's response (issue 15, item 10).
func TestOutputsSentPerInvocation(t *testing.T) {
	a := startPod(t, podOpts{})
	ctx := context.Background()
	send := func(inv, key string) {
		t.Helper()
		p, err := a.sdk.Payload([]byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.sdk.RPC().SendObject(ctx, &sidecarv1.SendObjectRequest{Session: "s1", Bucket: "b", Key: key, Object: p, InvocationId: inv}); err != nil {
			t.Fatal(err)
		}
		<-a.events
	}
	send("s1.3", "a")
	send("s1.3", "b")
	send("s1.3", "a") // sent again: one object
	send("s1.4", "c")
	send("", "d") // outside an invocation: nobody's output

	h := http.Header{}
	a.api.MarkOutputsSent(h, "s1", "s1.3")
	if got := invocation.OutputsSent(h); got != 2 {
		t.Errorf("s1.3 sent %d outputs (%q), want 2", got, h.Get(invocation.HeaderOutputsSent))
	}
	h = http.Header{}
	a.api.MarkOutputsSent(h, "s1", "s1.3")
	if v := h.Get(invocation.HeaderOutputsSent); v != "" {
		t.Errorf("counted twice: %q", v)
	}
	h = http.Header{}
	a.api.MarkOutputsSent(h, "s2", "s1.4") // another session's invocation of the same id
	if v := h.Get(invocation.HeaderOutputsSent); v != "" {
		t.Errorf("another session's count: %q", v)
	}
	a.api.MarkOutputsSent(h, "s1", "s1.4")
	if got := invocation.OutputsSent(h); got != 1 {
		t.Errorf("s1.4 sent %d outputs, want 1", got)
	}
}
