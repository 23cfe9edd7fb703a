package gateway_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ziptrail/ziptrail/internal/operator/control/guard/guardtest"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
)

// wireMethods are the gateway's methods, with a message of each request
// type to check that the fuzzer's bytes decode as it (gRPC answers bytes
// that do not with Internal, before the gateway sees them), and of each
// answer type.
var wireMethods = []struct {
	name      string
	stream    bool
	req, resp func() proto.Message
}{
	{gatewayv1.Gateway_StartSession_FullMethodName, false, func() proto.Message { return &gatewayv1.StartSessionRequest{} }, func() proto.Message { return &gatewayv1.Session{} }},
	{gatewayv1.Gateway_GetSession_FullMethodName, false, func() proto.Message { return &gatewayv1.SessionRef{} }, func() proto.Message { return &gatewayv1.Session{} }},
	{gatewayv1.Gateway_WaitSession_FullMethodName, false, func() proto.Message { return &gatewayv1.WaitSessionRequest{} }, func() proto.Message { return &gatewayv1.SessionResult{} }},
	{gatewayv1.Gateway_PlanShuffle_FullMethodName, false, func() proto.Message { return &gatewayv1.PlanShuffleRequest{} }, func() proto.Message { return &gatewayv1.PlanShuffleResponse{} }},
	{gatewayv1.Gateway_ReadResult_FullMethodName, true, func() proto.Message { return &gatewayv1.SessionRef{} }, func() proto.Message { return &gatewayv1.ResultChunk{} }},
	{gatewayv1.Gateway_WatchSession_FullMethodName, true, func() proto.Message { return &gatewayv1.SessionRef{} }, func() proto.Message { return &gatewayv1.SessionEvent{} }},
}

// FuzzGatewayGRPCWire sends arbitrary request messages, as bytes on the
// wire, to each method of the real gRPC gateway server (its guard and
// routing included), with a's runner's token (verified in the server's tap,
// the identity handed to the handler), a's ServiceAccount without the
// role, no token, or a fuzzed authorization value. Whatever arrives: no
// crash, no Unknown or Internal status, nothing succeeds without an
// allowed token, nothing of namespace b reaches a's users.
func FuzzGatewayGRPCWire(f *testing.F) {
	e := newFuzzEnv(f)
	cc, err := grpc.NewClient(e.f.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(guardtest.RawCodec{}), grpc.MaxCallRecvMsgSize(8<<20), grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { cc.Close() })
	seed := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	f.Add(uint8(1), uint8(0), seed(&gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo", Input: []byte("x")}), "")
	f.Add(uint8(1), uint8(1), seed(&gatewayv1.SessionRef{Namespace: "a", Id: e.sessionA}), "")
	f.Add(uint8(1), uint8(2), seed(&gatewayv1.WaitSessionRequest{Namespace: "a", Id: e.sessionA, TimeoutMs: 10}), "")
	f.Add(uint8(1), uint8(2), seed(&gatewayv1.WaitSessionRequest{Namespace: "b", Id: e.sessionB, TimeoutMs: 10}), "")
	f.Add(uint8(1), uint8(3), seed(&gatewayv1.PlanShuffleRequest{Namespace: "a", RequestJson: []byte(`{"bytes":1000000,"partitions":4}`)}), "")
	f.Add(uint8(1), uint8(4), seed(&gatewayv1.SessionRef{Namespace: "a", Id: e.sessionA}), "")
	f.Add(uint8(1), uint8(5), seed(&gatewayv1.SessionRef{Namespace: "a", Id: e.sessionA}), "")
	f.Add(uint8(1), uint8(4), seed(&gatewayv1.SessionRef{Namespace: "a", Id: e.sessionB}), "")
	f.Add(uint8(2), uint8(0), seed(&gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo"}), "")
	f.Add(uint8(0), uint8(1), seed(&gatewayv1.SessionRef{Namespace: "a", Id: e.sessionA}), "")
	f.Add(uint8(3), uint8(1), seed(&gatewayv1.SessionRef{Namespace: "a", Id: e.sessionA}), "Bearer not-a-token")
	f.Add(uint8(3), uint8(0), seed(&gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo"}), "bearer "+strings.Repeat("x", 300))
	f.Add(uint8(1), uint8(0), []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, "")
	f.Add(uint8(1), uint8(2), []byte{0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x0a, 0x01, 'a'}, "")
	f.Fuzz(func(t *testing.T, kind, method uint8, msg []byte, raw string) {
		m := wireMethods[int(method)%len(wireMethods)]
		if proto.Unmarshal(msg, m.req()) != nil {
			return // gRPC's decoding refuses it (Internal) before the gateway
		}
		auth, allowed := e.auth(kind, raw)
		if strings.ContainsAny(auth, "\r\n\x00") || !validHeader(auth) {
			return // not a header value a client can send
		}
		// Bounds a call that would wait (WaitSession's timeout, events of
		// a running session); not an assertion.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if auth != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", auth)
		}
		var leaked strings.Builder
		var err error
		if !m.stream {
			resp := m.resp()
			if err = cc.Invoke(ctx, m.name, msg, resp); err == nil {
				fmt.Fprintf(&leaked, "%v", resp)
				if r, ok := resp.(*gatewayv1.SessionResult); ok {
					leaked.Write(r.Result)
				}
			}
		} else {
			var st grpc.ClientStream
			st, err = cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, m.name)
			if err == nil {
				if err = st.SendMsg(msg); err == nil || err == io.EOF {
					_ = st.CloseSend()
					for {
						resp := m.resp()
						if err = st.RecvMsg(resp); err != nil {
							break
						}
						fmt.Fprintf(&leaked, "%v", resp)
						if c, ok := resp.(*gatewayv1.ResultChunk); ok {
							leaked.Write(c.Data)
						}
					}
					if err == io.EOF {
						err = nil
					}
				}
			}
		}
		code := status.Code(err)
		if err != nil {
			leaked.WriteString(status.Convert(err).Message())
		}
		if err == nil && !allowed {
			t.Fatalf("%s succeeded without an allowed token (kind %d)", m.name, kind%4)
		}
		if code == codes.Unknown || code == codes.Internal {
			t.Fatalf("%s: %v", m.name, err)
		}
		if allowed && code == codes.Unauthenticated {
			t.Fatalf("%s with a valid token: %v", m.name, err)
		}
		if s := leaked.String(); strings.Contains(s, e.secretB) || strings.Contains(s, e.sessionB) && !strings.Contains(string(msg), e.sessionB) {
			t.Fatalf("%s leaked namespace b: %s", m.name, s)
		}
	})
}

// validHeader reports whether v is a header value gRPC's client sends
// (printable ASCII).
func validHeader(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return false
		}
	}
	return true
}
