package controlclient

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// operator is a control service that records every message a stream
// carries, as it arrives on the wire, and acknowledges every event at
// once. Without features it is an operator of the first protocol version:
// it never announces Features, as the operators before Events did.
type operator struct {
	controlv1.UnimplementedControlServer
	features *controlv1.Features
	mu       sync.Mutex
	wire     []*controlv1.SidecarMessage // messages after the Hello
	got      chan struct{}
}

func (o *operator) Connect(st controlv1.Control_ConnectServer) error {
	if _, err := st.Recv(); err != nil { // Hello
		return err
	}
	if err := st.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Keys{Keys: &controlv1.Keys{}}}); err != nil {
		return err
	}
	if o.features != nil {
		if err := st.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Features{Features: o.features}}); err != nil {
			return err
		}
	}
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		seq := m.Seq
		for _, ev := range m.GetEvents().GetEvents() {
			seq = ev.Seq
		}
		o.mu.Lock()
		o.wire = append(o.wire, m)
		o.mu.Unlock()
		o.got <- struct{}{}
		if err := st.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Ack{Ack: &controlv1.Ack{Seq: seq}}}); err != nil {
			return err
		}
	}
}

// events lists the events the operator received, in order, and how many
// messages carried them.
func (o *operator) events() (evs []string, messages int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range o.wire {
		inner := m.GetEvents().GetEvents()
		if inner == nil {
			inner = []*controlv1.SidecarMessage{m}
		}
		for _, ev := range inner {
			evs = append(evs, fmt.Sprintf("%d:%s", ev.Seq, ev.GetFunctionFinished().GetInvocationId()))
		}
	}
	return evs, len(o.wire)
}

func serveOperator(t *testing.T, o *operator) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	controlv1.RegisterControlServer(srv, o)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// TestEventsGoTogetherOnlyToAnOperatorThatSaysSo: events queued together
// (SendAll) reach an operator that announced Features.events in one
// message, and an operator of the first protocol version (a rolling
// upgrade: the sidecar is new, the operator not yet) one message each;
// either way every event arrives once, in order, and is acknowledged.
func TestEventsGoTogetherOnlyToAnOperatorThatSaysSo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		features *controlv1.Features
		messages int
	}{
		{"new operator", &controlv1.Features{Events: true}, 2},
		{"operator without Features", nil, 4},
		{"operator announcing no events", &controlv1.Features{}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &operator{features: tc.features, got: make(chan struct{}, 16)}
			c := NewClient(serveOperator(t, o), func() (string, error) { return "t", nil }, &controlv1.Hello{Namespace: "ns", Pod: "p"}, Commands{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = c.Run(ctx) }()
			fin := func(inv string) *controlv1.SidecarMessage {
				return &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionFinished{FunctionFinished: &controlv1.FunctionFinished{InvocationId: inv}}}
			}
			deadline := time.After(30 * time.Second)
			acked := func() {
				t.Helper()
				for c.Unacked() != 0 {
					select {
					case <-deadline:
						t.Fatalf("%d events not acknowledged", c.Unacked())
					case <-time.After(5 * time.Millisecond):
					}
				}
			}
			// The first event waits for the stream; once it is
			// acknowledged, the client has read what came before the
			// ack, Features included. The three after it are queued
			// together.
			if err := c.Send(fin("a")); err != nil {
				t.Fatal(err)
			}
			acked()
			if err := c.SendAll(fin("b"), fin("c"), fin("d")); err != nil {
				t.Fatal(err)
			}
			for {
				evs, n := o.events()
				if len(evs) == 4 {
					if want := "[1:a 2:b 3:c 4:d]"; fmt.Sprint(evs) != want || n != tc.messages {
						t.Fatalf("the operator received %v in %d messages, want %s in %d", evs, n, want, tc.messages)
					}
					break
				}
				select {
				case <-o.got:
				case <-deadline:
					t.Fatalf("the operator received %v", evs)
				}
			}
			acked()
		})
	}
}

// TestEventsMessagesAreBounded: one Events message holds at most 256
// events and about 1 MiB; a larger event goes alone.
func TestEventsMessagesAreBounded(t *testing.T) {
	small := func() *controlv1.SidecarMessage {
		return &controlv1.SidecarMessage{Seq: 1, Msg: &controlv1.SidecarMessage_FunctionFinished{FunctionFinished: &controlv1.FunctionFinished{}}}
	}
	big := func(n int) *controlv1.SidecarMessage {
		return &controlv1.SidecarMessage{Seq: 1, Msg: &controlv1.SidecarMessage_FunctionFinished{FunctionFinished: &controlv1.FunctionFinished{ReturnValue: make([]byte, n)}}}
	}
	many := make([]*controlv1.SidecarMessage, 300)
	for i := range many {
		many[i] = small()
	}
	for _, tc := range []struct {
		name string
		evs  []*controlv1.SidecarMessage
		want int
	}{
		{"300 small", many, 256},
		{"one", many[:1], 1},
		{"a large one first", []*controlv1.SidecarMessage{big(2 << 20), small()}, 1},
		{"then a large one", []*controlv1.SidecarMessage{small(), big(2 << 20)}, 1},
		{"three of 400 KiB", []*controlv1.SidecarMessage{big(400 << 10), big(400 << 10), big(400 << 10)}, 2},
	} {
		if got := eventsMessage(tc.evs); got != tc.want {
			t.Errorf("%s: %d events in the first message, want %d", tc.name, got, tc.want)
		}
	}
}
