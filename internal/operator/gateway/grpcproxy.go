package gateway

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/retry"
)

// gRPC calls about a workflow another operator replica serves are
// authorized here, then forwarded to that replica's gRPC gateway with the
// caller's credentials (GRPC.Owners, the gRPC port's addresses), as the
// HTTP gateway does (proxy.go).

const proxiedKey = "ziptrail-proxied"

func proxied(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(proxiedKey)) > 0
}

// fromPeer: the call was forwarded (proxiedKey, which anyone can set) from
// the address of another replica, whose connection carries every
// client's forwarded calls: its refusals are not paced (the forwarding
// replica paced its client's own connection).
func (g *GRPC) fromPeer(ctx context.Context) bool {
	if g.Owners == nil || !proxied(ctx) {
		return false
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return false
	}
	return isPeer(ctx, g.Owners, p.Addr.String())
}

// grpcRoute finds the workflow a call is about, and what authorizes it.
func grpcRoute(req any) (ns, wf string, a Attributes, ok bool) {
	switch r := req.(type) {
	case *gatewayv1.StartSessionRequest:
		return r.Namespace, r.Workflow, Attributes{Verb: "create", Namespace: r.Namespace, Workflow: r.Workflow}, true
	case *gatewayv1.SessionRef:
		ns, wf = r.Namespace, WorkflowOfSession(r.Id)
	case *gatewayv1.WaitSessionRequest:
		ns, wf = r.Namespace, WorkflowOfSession(r.Id)
	case *gatewayv1.AckResultRequest:
		ns, wf = r.Namespace, WorkflowOfSession(r.Id)
	default:
		return "", "", a, false
	}
	return ns, wf, Attributes{Verb: "get", Namespace: ns, Workflow: wf}, wf != ""
}

// owner is where a call goes: "" to answer it here.
func (g *GRPC) owner(ctx context.Context, req any) (string, error) {
	if g.Owners == nil {
		return "", nil
	}
	ns, wf, a, ok := grpcRoute(req)
	if !ok || checkNames(ns, wf) != nil {
		return "", nil
	}
	addr, bucket, err := g.Owners.Route(ctx, ns, wf)
	if err == nil && addr == "" {
		return "", nil
	}
	if aerr := g.H.allow(ctx, token(ctx), a); aerr != nil {
		return "", status.Error(grpcCode(authError(aerr).Code), aerr.Error())
	}
	if err == nil && proxied(ctx) { // never forwarded twice (ProxiedHeader)
		err = errNotServedHere
	}
	if err != nil {
		return "", status.Errorf(codes.Unavailable, "%v: workflow %s/%s (engine bucket %s): %v", ErrEngineMoving, ns, wf, bucket, err)
	}
	return addr, nil
}

// forwardCtx carries the caller's credentials to the owner.
func forwardCtx(ctx context.Context) context.Context {
	md := metadata.Pairs("authorization", "Bearer "+token(ctx), proxiedKey, "1")
	if in, _ := metadata.FromIncomingContext(ctx); len(in.Get(IdempotencyKeyMetadata)) > 0 {
		md.Set(IdempotencyKeyMetadata, in.Get(IdempotencyKeyMetadata)[0])
	}
	return metadata.NewOutgoingContext(ctx, md)
}

func (g *GRPC) conn(addr string) (*grpc.ClientConn, error) {
	g.connsMu.Lock()
	defer g.connsMu.Unlock()
	if c, ok := g.conns[addr]; ok {
		return c, nil
	}
	// A replica restarted on the same address (a SIGKILLed owner) is
	// dialled again within 2 s, not after gRPC's backoff of up to 2 minutes.
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithConnectParams(retry.GRPCReconnect),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(int(g.H.MaxInput)+1<<20), grpc.MaxCallSendMsgSize(int(g.H.MaxInput)+1<<20)))
	if err != nil {
		return nil, err
	}
	if g.conns == nil {
		g.conns = map[string]*grpc.ClientConn{}
	}
	g.conns[addr] = c
	return c, nil
}

func (g *GRPC) unaryRoute(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	addr, err := g.owner(ctx, req)
	if err != nil || addr == "" {
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
	var reply proto.Message
	switch req.(type) {
	case *gatewayv1.StartSessionRequest, *gatewayv1.SessionRef:
		reply = &gatewayv1.Session{}
	case *gatewayv1.WaitSessionRequest:
		reply = &gatewayv1.SessionResult{}
	case *gatewayv1.AckResultRequest:
		reply = &gatewayv1.AckResultResponse{}
	default:
		return handler(ctx, req)
	}
	c, err := g.conn(addr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "the owner replica %s: %v", addr, err)
	}
	if err := c.Invoke(forwardCtx(ctx), info.FullMethod, req, reply); err != nil {
		return nil, err
	}
	return reply, nil
}

func (g *GRPC) streamRoute(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	var newMsg func() proto.Message
	switch info.FullMethod {
	case gatewayv1.Gateway_ReadResult_FullMethodName:
		newMsg = func() proto.Message { return &gatewayv1.ResultChunk{} }
	case gatewayv1.Gateway_WatchSession_FullMethodName:
		newMsg = func() proto.Message { return &gatewayv1.SessionEvent{} }
	default:
		return handler(srv, ss)
	}
	req := &gatewayv1.SessionRef{}
	if err := ss.RecvMsg(req); err != nil {
		return err
	}
	addr, err := g.owner(ss.Context(), req)
	if err != nil {
		return err
	}
	if addr == "" {
		return handler(srv, &replayed{ServerStream: ss, first: req})
	}
	c, err := g.conn(addr)
	if err != nil {
		return status.Errorf(codes.Unavailable, "the owner replica %s: %v", addr, err)
	}
	cs, err := c.NewStream(forwardCtx(ss.Context()), &grpc.StreamDesc{ServerStreams: true}, info.FullMethod)
	if err != nil {
		return err
	}
	if err := cs.SendMsg(req); err != nil {
		return err
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	for {
		m := newMsg()
		if err := cs.RecvMsg(m); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if err := ss.SendMsg(m); err != nil {
			return err
		}
	}
}

// replayed hands the request already read back to the local handler.
type replayed struct {
	grpc.ServerStream
	once  sync.Once
	first proto.Message
}

func (r *replayed) RecvMsg(m any) error {
	var err error = io.EOF
	used := false
	r.once.Do(func() {
		used = true
		proto.Merge(m.(proto.Message), r.first)
		err = nil
	})
	if used {
		return err
	}
	return r.ServerStream.RecvMsg(m)
}
