package control_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard/guardtest"
)

// checker receives what the server delivers and notes every event the
// engine's side could not rely on.
type checker struct {
	mu     sync.Mutex
	events int
	from   []control.Identity
	bad    []string
}

func (c *checker) note(id control.Identity, what string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events++
	c.from = append(c.from, id)
	if !ok {
		c.bad = append(c.bad, what)
	}
}

func (c *checker) ObjectReady(_ context.Context, id control.Identity, ev *controlv1.ObjectReady) error {
	c.note(id, fmt.Sprintf("ObjectReady %+v", ev), ev.Session != "" && ev.Bucket != "" && ev.Key != "" && (ev.Ref != "" || ev.Inline != nil))
	return nil
}

func (c *checker) FunctionStarted(_ context.Context, id control.Identity, ev *controlv1.FunctionStarted) error {
	c.note(id, "FunctionStarted", true)
	return nil
}

func (c *checker) FunctionFinished(_ context.Context, id control.Identity, ev *controlv1.FunctionFinished) error {
	c.note(id, "FunctionFinished", true)
	return errors.New("rejected: the stream must go on") // a rejected event never ends the stream
}

func (c *checker) take() (int, []control.Identity, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, from, bad := c.events, c.from, c.bad
	c.events, c.from, c.bad = 0, nil, nil
	return n, from, bad
}

// frames encodes control-stream frames for the fuzzer's input: a flag byte
// (bit 0: open with a valid Hello) then frames, each a 2-byte big-endian
// length and that many bytes; a short tail is one last frame.
func frames(hello bool, msgs ...[]byte) []byte {
	out := []byte{0}
	if hello {
		out[0] = 1
	}
	for _, m := range msgs {
		out = binary.BigEndian.AppendUint16(out, uint16(len(m)))
		out = append(out, m...)
	}
	return out
}

func split(data []byte) (hello bool, msgs [][]byte) {
	if len(data) == 0 {
		return false, nil
	}
	hello, data = data[0]&1 == 1, data[1:]
	for len(data) > 0 {
		if len(data) < 2 {
			return hello, append(msgs, data)
		}
		n := int(binary.BigEndian.Uint16(data))
		data = data[2:]
		if n > len(data) {
			n = len(data)
		}
		msgs, data = append(msgs, data[:n]), data[n:]
	}
	return hello, msgs
}

func wire(m *controlv1.SidecarMessage) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

var fuzzHello = wire(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Hello{Hello: &controlv1.Hello{
	Namespace: "ns", Workflow: "wf", Function: "map", Pod: "map-1", DataplaneAddr: "10.0.0.1:9091"}}})

// FuzzControlMessages feeds arbitrary frames to the operator's control
// stream server over a real gRPC connection, as a sidecar (or anything
// that reached its port) could send them: with or without a Hello first,
// well-formed messages, truncated ones, unknown fields, repeated Hellos,
// empty objects. The server must neither crash nor hang, end a stream that
// does not begin with a Hello, and deliver only events the engine's side
// can rely on, under the identity of the stream's Hello.
func FuzzControlMessages(f *testing.F) {
	obj := func(o *controlv1.ObjectReady) []byte {
		return wire(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: o}, Seq: 1})
	}
	f.Add(frames(true, obj(&controlv1.ObjectReady{Session: "s", Bucket: "b", Key: "k", Inline: []byte("x"), Metadata: map[string]string{"group": "g"}})))
	f.Add(frames(true, obj(&controlv1.ObjectReady{Session: "s", Bucket: "b", Key: "empty", Inline: []byte{}, InvocationId: "s.1"})))
	f.Add(frames(true, obj(&controlv1.ObjectReady{Session: "s", Bucket: "b", Key: "k"}))) // neither ref nor bytes
	f.Add(frames(true, obj(&controlv1.ObjectReady{Session: "s", Bucket: "b", Key: "big", Ref: "zt1.AAAA", Size: 1 << 40})))
	f.Add(frames(true,
		wire(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionStarted{FunctionStarted: &controlv1.FunctionStarted{Session: "s", Function: "map", InvocationId: "s.1", Args: []byte("[]")}}, Seq: 1}),
		wire(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionFinished{FunctionFinished: &controlv1.FunctionFinished{Session: "s", Function: "map", InvocationId: "s.1", OutputsSent: 3}}, Seq: 2})))
	started := &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionStarted{FunctionStarted: &controlv1.FunctionStarted{Session: "s", Function: "map", InvocationId: "s.d1", Args: []byte("[]")}}, Seq: 1}
	finished := &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionFinished{FunctionFinished: &controlv1.FunctionFinished{Session: "s", Function: "map", InvocationId: "s.d1"}}, Seq: 2}
	f.Add(frames(true, wire(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Events{Events: &controlv1.Events{Events: []*controlv1.SidecarMessage{started, finished}}}})))
	f.Add(frames(true, wire(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Events{Events: &controlv1.Events{Events: []*controlv1.SidecarMessage{finished, started}}}}))) // out of order
	f.Add(frames(true, fuzzHello))                                                                                                                                                 // a second Hello
	f.Add(frames(false, obj(&controlv1.ObjectReady{Session: "s", Bucket: "b", Key: "k", Inline: []byte("x")})))                                                                    // no Hello
	f.Add(frames(false, []byte{0x0a, 0x02, 0x0a}))                                                                                                                                 // truncated Hello
	f.Add(frames(true, []byte{0xff, 0xff, 0xff, 0xff, 0x0f}, []byte{0x12, 0x80, 0x80, 0x80, 0x80, 0x10}))
	f.Add(frames(true, append(obj(&controlv1.ObjectReady{Session: "s", Bucket: "b", Key: "k", Inline: []byte("x")}), 0xf8, 0x07, 0x01))) // unknown field

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	chk := &checker{}
	srv := control.NewServer(chk, staticKeys{})
	srv.Auth = &testAuth{}
	// Served as cmd/operator serves it: the token checked in the tap,
	// the guard's limits on every stream.
	gs := grpc.NewServer(srv.ServerOptions()...)
	controlv1.RegisterControlServer(gs, srv)
	go gs.Serve(srv.Listener(ln))
	f.Cleanup(gs.Stop)
	// The fuzzer is the pod of fuzzHello: its token is that pod's.
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(controlclient.PerRPCCredentials(testToken("ns", "map-1"))))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { cc.Close() })
	desc := &controlv1.Control_ServiceDesc.Streams[0]
	method := "/" + controlv1.Control_ServiceDesc.ServiceName + "/" + desc.StreamName

	f.Fuzz(func(t *testing.T, data []byte) {
		hello, msgs := split(data)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := cc.NewStream(ctx, desc, method, grpc.ForceCodec(guardtest.RawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		if hello {
			msgs = append([][]byte{fuzzHello}, msgs...)
		}
		for _, m := range msgs {
			if st.SendMsg(m) != nil {
				break // the server ended the stream
			}
		}
		_ = st.CloseSend()
		// The stream ends once the server has handled every frame.
		for {
			if err := st.RecvMsg(&controlv1.OperatorMessage{}); err != nil {
				break
			}
		}
		n, from, bad := chk.take()
		for _, b := range bad {
			t.Errorf("delivered what the engine cannot rely on: %s", b)
		}
		if n == 0 {
			return
		}
		h := firstHello(msgs)
		if h == nil {
			t.Fatalf("%d events delivered on a stream that did not begin with a valid Hello", n)
		}
		for _, id := range from {
			if id.Namespace != h.Namespace || id.Pod != h.Pod || id.Function != h.Function || id.Workflow != h.Workflow {
				t.Errorf("event delivered as %+v on the stream of %+v", id, h)
			}
		}
	})
}

// firstHello is the stream's Hello when its first frame is a valid one.
func firstHello(msgs [][]byte) *controlv1.Hello {
	if len(msgs) == 0 {
		return nil
	}
	var m controlv1.SidecarMessage
	if proto.Unmarshal(msgs[0], &m) != nil {
		return nil
	}
	if h := m.GetHello(); h != nil && h.Namespace != "" && h.Pod != "" {
		return h
	}
	return nil
}
