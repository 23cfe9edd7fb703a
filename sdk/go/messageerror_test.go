package ziptrail

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestMessageErrorKinds: the messaging socket's errors get the kinds the
// gRPC calls' get (by reason; the classes without one as their codes; a
// context that ended is KindTimeout wrapping ctx's error).
func TestMessageErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		reason     string
		kind       Kind
		keepReason bool
	}{
		{localapi.ReasonPeerGone, KindPeerGone, true},
		{localapi.ReasonMsgTimeout, KindTimeout, true},
		{localapi.ReasonMsgForeign, KindForeign, true},
		{localapi.ReasonGroupClosed, KindClosed, true},
		{localapi.ReasonGroupConflict, KindConflict, true},
		{localapi.ReasonMsgInvalid, KindInvalid, true},
		{localapi.ReasonNoDirectory, KindUnavailable, true},
		{localapi.ReasonBadPayload, KindInvalid, true},
		{"UNAVAILABLE", KindUnavailable, false},
		{"CANCELED", KindTimeout, false},
		{"INTERNAL", KindInternal, false},
	} {
		err := messageError(context.Background(), "send", &localapi.MessageError{Reason: tc.reason, Message: "what happened"})
		var e *Error
		if !errors.As(err, &e) || e.Kind != tc.kind || e.Op != "send" || !strings.Contains(err.Error(), "what happened") {
			t.Errorf("%s: got %v, want kind %s", tc.reason, err, tc.kind)
			continue
		}
		if want := map[bool]string{true: tc.reason}[tc.keepReason]; e.Reason != want {
			t.Errorf("%s: reason %q, want %q", tc.reason, e.Reason, want)
		}
		var me *localapi.MessageError
		if !errors.As(err, &me) {
			t.Errorf("%s: the socket's error is not reachable through Unwrap", tc.reason)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := messageError(ctx, "recv", &localapi.MessageError{Reason: localapi.ReasonMsgTimeout, Message: "call ended"})
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Errorf("ended context: %v", err)
	}
	if err := peerError(messageError(context.Background(), "recv", &localapi.MessageError{Reason: localapi.ReasonPeerGone, Message: "gone"}), 3); !strings.Contains(err.Error(), "rank 3") {
		t.Errorf("peer gone does not name the rank: %v", err)
	}
}

// TestMessageRecvCancelled: a Recv whose context is cancelled (no
// deadline) ends with ErrTimeout wrapping context.Canceled; messages go
// on afterwards (the call's connection, dropped, is not reused).
func TestMessageRecvCancelled(t *testing.T) {
	op := servers.StartOperator(t)
	a, b := startPod(t, op, "ns", "pod-a"), startPod(t, op, "ns", "pod-b")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gs := joinAll(t, ctx, []*sidecar{a, b}, "s1", "cancel", 2)

	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := gs[1].Recv(rctx, 0, 3)
		done <- err
	}()
	time.AfterFunc(100*time.Millisecond, rcancel)
	if err := <-done; !errors.Is(err, ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled recv: %v, want ErrTimeout wrapping context.Canceled", err)
	}
	if err := gs[0].Send(ctx, 1, 4, []byte("after")); err != nil {
		t.Fatal(err)
	}
	m, err := gs[1].Recv(ctx, 0, 4)
	if err != nil || string(m.Bytes()) != "after" {
		t.Fatalf("recv after a cancelled one: %v, %v", m, err)
	}
}
