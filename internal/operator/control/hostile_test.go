package control_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard/guardtest"
)

// Hostile input on the control service's port, played from the outside
// with raw HTTP/2 clients whose messages are generated as they are sent
// (the heap measured is the server's).

// TestGetKeysRefusesBodiesOfUnauthenticatedCalls: sixteen connections with
// the token "not-a-token" each send a GetKeys of almost 4 MiB (the largest
// message the control service takes). Each is refused with
// Unauthenticated without the server reading or holding the message: its
// heap grows by less than 16 MiB. A sidecar still connects.
func TestGetKeysRefusesBodiesOfUnauthenticatedCalls(t *testing.T) {
	a := newAuthEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const conns, size = 16, 4<<20 - 1<<10
	readBefore := a.read.Read.Load()
	heap := guardtest.WatchHeap()
	results := make([]guardtest.Result, conns)
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			results[i], errs[i] = guardtest.Call(ctx, a.addr, controlv1.Control_GetKeys_FullMethodName, "not-a-token",
				guardtest.BytesMessage(nil, 1, size))
		})
	}
	wg.Wait()
	grew := heap.Stop()
	read := a.read.Read.Load() - readBefore
	t.Logf("%d connections sending GetKeys of %.1f MiB each with a bad token: the server's heap grew by %.1f MiB, it read %.1f MiB",
		conns, float64(size)/(1<<20), float64(grew)/(1<<20), float64(read)/(1<<20))
	for i := range conns {
		if errs[i] != nil || results[i].Code != codes.Unauthenticated {
			t.Errorf("connection %d: %v %v, want Unauthenticated", i, results[i], errs[i])
		}
	}
	t.Logf("connection 0: %v", results[0])
	if grew > 16<<20 {
		t.Errorf("the server's heap grew by %d MiB while unauthenticated clients sent %d MiB: it buffers their messages", grew>>20, conns*size>>20)
	}
	if read > 16<<20 {
		t.Errorf("the server read %d MiB from unauthenticated clients", read>>20)
	}

	p := a.pod(t, "team-a", "fn-1")
	if _, keys, err := a.connect(ctx, a.podToken(t, p, control.Audience), "team-a", "fn-1"); err != nil || keys == nil {
		t.Errorf("a sidecar after the flood: %v (keys %v)", err, keys)
	}
}

// TestControlStalledMessageEnded: an authenticated GetKeys, or control
// stream whose Hello, stops arriving midway is ended once the receive
// limit passes; a stream idle between messages is not.
func TestControlStalledMessageEnded(t *testing.T) {
	const limit = time.Second
	a := newAuthEnvWith(t, func(a *authEnv) { a.srv.Limits = guard.Limits{RecvTimeout: limit} })
	p := a.pod(t, "team-a", "fn-1")
	token := a.podToken(t, p, control.Audience)
	hello, _ := proto.Marshal(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Hello{Hello: &controlv1.Hello{
		Namespace: "team-a", Workflow: "wf", Function: "map", Pod: "fn-1"}}})

	for _, c := range []struct {
		method string
		msg    io.Reader
	}{
		{controlv1.Control_GetKeys_FullMethodName, guardtest.BytesMessage(nil, 1, 1<<20)},
		{controlv1.Control_Connect_FullMethodName, bytes.NewReader(append(guardtest.Frame(int64(len(hello))), hello...))},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		res, err := guardtest.Call(ctx, a.addr, c.method, token, guardtest.Stall(ctx, io.LimitReader(c.msg, 12)))
		took := time.Since(start)
		cancel()
		t.Logf("%s stalled after 12 bytes: %v %v after %s", c.method, res, err, took.Round(time.Millisecond))
		if err != nil || res.Code != codes.DeadlineExceeded || took > limit+3*time.Second {
			t.Errorf("%s stalled midway: %v %v after %s, want DeadlineExceeded within about %s", c.method, res, err, took, limit)
		}
	}

	// A sidecar's stream, idle longer than the limit after its Hello,
	// goes on.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, keys, err := a.connect(ctx, token, "team-a", "fn-1")
	if err != nil || keys == nil {
		t.Fatalf("connect: %v", err)
	}
	time.Sleep(limit + 500*time.Millisecond)
	if err := st.Send(&controlv1.SidecarMessage{Seq: 1, Msg: &controlv1.SidecarMessage_FunctionStarted{FunctionStarted: &controlv1.FunctionStarted{
		Session: "wf-a-1", Function: "map", InvocationId: "wf-a-1.1"}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.rec.got:
	case <-ctx.Done():
		t.Fatal("an event sent after an idle spell longer than the receive limit was not delivered")
	}
}

// TestControlUnauthenticatedConnectionCap: connections that authenticate
// nothing are capped and closed after the auth timeout; a new one over
// the cap is refused while an authenticated sidecar keeps working.
func TestControlUnauthenticatedConnectionCap(t *testing.T) {
	a := newAuthEnvWith(t, func(a *authEnv) {
		a.srv.Limits = guard.Limits{MaxUnauthConns: 2, AuthTimeout: 1500 * time.Millisecond}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := a.pod(t, "team-a", "fn-1")
	token := a.podToken(t, p, control.Audience)
	st, _, err := a.connect(ctx, token, "team-a", "fn-1")
	if err != nil {
		t.Fatal(err)
	}
	var idle []net.Conn
	for range 2 {
		c, err := guardtest.Idle(ctx, a.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	refused, c, err := guardtest.Refused(rctx, a.addr)
	rcancel()
	if c != nil {
		c.Close()
	}
	if err != nil || !refused {
		t.Fatalf("a third unauthenticated connection: refused %v (%v), want refused", refused, err)
	}
	// The sidecar's connection works on: a call and an event.
	if _, err := a.cl.GetKeys(withToken(ctx, token), &controlv1.GetKeysRequest{Namespace: "team-a"}); err != nil {
		t.Errorf("GetKeys of the authenticated sidecar: %v", err)
	}
	if err := st.Send(&controlv1.SidecarMessage{Seq: 1, Msg: &controlv1.SidecarMessage_FunctionStarted{FunctionStarted: &controlv1.FunctionStarted{
		Session: "wf-a-1", Function: "map", InvocationId: "wf-a-1.1"}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.rec.got:
	case <-ctx.Done():
		t.Fatal("the authenticated stream's event was not delivered")
	}
	for i, c := range idle {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if !guardtest.Closed(cctx, c) {
			t.Errorf("idle connection %d still open after the auth timeout", i)
		}
		cancel()
	}
	// Room again: another sidecar connects.
	p2 := a.pod(t, "team-a", "fn-2")
	if _, _, err := a.connect(ctx, a.podToken(t, p2, control.Audience), "team-a", "fn-2"); err != nil {
		t.Errorf("a sidecar once the idle connections closed: %v", err)
	}
}
