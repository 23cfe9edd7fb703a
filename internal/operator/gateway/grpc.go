package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	authnv1 "k8s.io/api/authentication/v1"

	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// MaxInlineResult is the largest result WaitSession returns in its answer;
// larger ones stream through ReadResult.
const MaxInlineResult = 1 << 20

// resultChunk is the size of ReadResult's messages.
const resultChunk = 256 << 10

// GRPC serves the gateway over gRPC with the same semantics as the HTTP API.
// Serve it with its ServerOptions on its Listener: every call is then
// authenticated before its message is read, and its callers are bounded
// by Limits (internal/operator/control/guard).
type GRPC struct {
	gatewayv1.UnimplementedGatewayServer
	H *Handler
	// Owners, when set, forward calls about workflows another operator
	// replica serves to its gRPC gateway (grpcproxy.go).
	Owners Owners
	// Limits bound the gateway's callers; zero fields take
	// DefaultGRPCLimits (MaxRecvMsgSize: MaxStartMessage). Set them before
	// ServerOptions is called.
	Limits guard.Limits

	guardOnce sync.Once
	guard     *guard.Guard

	connsMu sync.Mutex
	conns   map[string]*grpc.ClientConn
}

// DefaultGRPCLimits are the gRPC gateway's limits where GRPC.Limits leaves
// them zero:
//   - 1024 connections, of which 64 may have authenticated no call yet
//     (and for at most 10 s); the HTTP/2 handshake within 5 s;
//   - a token verified within 5 s (TokenReview, cached by KubeAuth);
//   - 100 calls at once per connection, headers up to 64 KiB;
//   - a call's message whole within 60 s of the call's start: a
//     64 MiB input (the chart's limit) needs at least about 1.1 MB/s;
//     slower clients put large data into a bucket and pass its key;
//   - client pings at most every 10 s;
//   - a call's flow-control window 256 KiB (what a refused call can make
//     the server read: a 64 MiB input still arrives at 256 MB/s at a 1 ms
//     round trip), and a connection refused more than 10 calls a second
//     left unread until it is back under (a flood of refused calls is
//     then held back by TCP).
//
// MaxRecvMsgSize is MaxStartMessage: the largest StartSession the gateway
// accepts.
var DefaultGRPCLimits = guard.Limits{
	MaxConns: 1024, MaxUnauthConns: 64, AuthTimeout: 10 * time.Second,
	HandshakeTimeout: 5 * time.Second, ReviewTimeout: 5 * time.Second,
	MaxStreams: 100, MaxHeaderBytes: 64 << 10, RecvTimeout: time.Minute, MinPingInterval: 10 * time.Second,
	Window: 256 << 10, RefusalsPerSecond: 10,
}

// startOverhead bounds what a StartSessionRequest holds besides its input:
// the namespace (≤ 63 bytes) and workflow (≤ 253) fields, the input's
// tag and length (≤ 336 bytes in all).
const startOverhead = 1 << 10

// MaxStartMessage is the largest StartSession message the gateway reads,
// and thus the largest message of any call: an input of H.MaxInput (the
// HTTP gateway's limit too) with the longest names. A larger one is
// refused with ResourceExhausted before it is read.
func (g *GRPC) MaxStartMessage() int { return int(g.H.MaxInput) + startOverhead }

func (g *GRPC) guardian() *guard.Guard {
	g.guardOnce.Do(func() {
		l := g.Limits.Or(DefaultGRPCLimits)
		if l.MaxRecvMsgSize == 0 {
			l.MaxRecvMsgSize = g.MaxStartMessage()
		}
		g.guard = guard.New("gateway", l, g.authenticate)
		g.guard.Exempt = g.fromPeer
	})
	return g.guard
}

// ServerOptions are the grpc.Server options the gateway needs: its guard
// (a call is authenticated before its message is read; connections,
// streams, message sizes and receive times bounded by Limits), then its
// routing to the owner replica (grpcproxy.go).
func (g *GRPC) ServerOptions() []grpc.ServerOption {
	return append(g.guardian().ServerOptions(),
		grpc.ChainUnaryInterceptor(g.unaryRoute), grpc.ChainStreamInterceptor(g.streamRoute))
}

// Listener wraps the gateway's listener: connections capped, and those
// that authenticate no call closed (Limits). Serve the server with it.
func (g *GRPC) Listener(ln net.Listener) net.Listener { return g.guardian().Listener(ln) }

// tokenIdentity is who the tap found a call's token to be.
type tokenIdentity struct {
	token string
	user  authnv1.UserInfo
}

// authenticate runs in the server's tap, before the call exists or its
// message is read: no bearer token, or one the API server rejects, and
// the call is refused without the server taking in its message. The user
// found travels in the call's context, so the handler only authorizes
// (SubjectAccessReview, per namespace: the namespace is in the message).
// An Authorizer that cannot verify a token alone (not a
// TokenAuthenticator) leaves the handler to authenticate.
func (g *GRPC) authenticate(ctx context.Context, info *tap.Info) (any, error) {
	var tok string
	for _, v := range info.Header.Get("authorization") {
		if tok = bearer(v); tok != "" {
			break
		}
	}
	if tok == "" {
		return nil, status.Error(codes.Unauthenticated, "the session gateway needs Kubernetes credentials: send a bearer token (authorization: Bearer <token>)")
	}
	if g.H.Auth == nil {
		return nil, status.Error(codes.Unavailable, "the session gateway has no authorizer configured")
	}
	ta, ok := g.H.Auth.(TokenAuthenticator)
	if !ok {
		return nil, nil
	}
	u, err := ta.Authenticate(ctx, tok)
	if err != nil {
		ae := authError(err)
		return nil, status.Error(grpcCode(ae.Code), ae.Msg)
	}
	return tokenIdentity{token: tok, user: u}, nil
}

func toProto(s sessions.Session) *gatewayv1.Session {
	p := &gatewayv1.Session{Id: s.ID, Namespace: s.Namespace, Workflow: s.Workflow, State: string(s.State),
		StartedUnixMs: s.Started.UnixMilli(), Invocations: int32(s.Invocations), Objects: int32(s.Objects), Error: s.Error}
	if s.Ended != nil {
		p.EndedUnixMs = s.Ended.UnixMilli()
	}
	if s.Result != nil {
		p.ResultBucket, p.ResultKey, p.ResultSize = s.Result.Bucket, s.Result.Key, s.Result.Size
	}
	return p
}

// grpcCode maps the gateway's HTTP statuses to gRPC codes.
func grpcCode(httpCode int) codes.Code {
	switch httpCode {
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusConflict, http.StatusLengthRequired:
		return codes.FailedPrecondition
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return codes.Unavailable
	case http.StatusGone:
		return codes.NotFound
	}
	return codes.Internal
}

// token reads the bearer token of a call.
func token(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if t := bearer(v); t != "" {
			return t
		}
	}
	return ""
}

func (g *GRPC) lookup(ctx context.Context, ns, id string) (sessions.Session, error) {
	s, code, err := g.H.lookup(ctx, token(ctx), ns, id)
	if err != nil {
		return s, status.Error(grpcCode(code), err.Error())
	}
	return s, nil
}

// StartSession implements gatewayv1.GatewayServer.
func (g *GRPC) StartSession(ctx context.Context, req *gatewayv1.StartSessionRequest) (*gatewayv1.Session, error) {
	if err := checkNames(req.Namespace, req.Workflow); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := g.H.allow(ctx, token(ctx), Attributes{Verb: "create", Namespace: req.Namespace, Workflow: req.Workflow}); err != nil {
		return nil, status.Error(grpcCode(authError(err).Code), err.Error())
	}
	if int64(len(req.Input)) > g.H.MaxInput {
		return nil, status.Errorf(codes.ResourceExhausted, "input of %d bytes exceeds the gateway's limit of %d bytes: put large data into a bucket and pass its key", len(req.Input), g.H.MaxInput)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var key string
	if keys := md.Get(IdempotencyKeyMetadata); len(keys) > 0 {
		key = keys[0]
	}
	sctx, err := withKeyHeader(ctx, key)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	id, err := g.H.Starter.Start(sctx, req.Namespace, req.Workflow, bytes.NewReader(req.Input), int64(len(req.Input)))
	if err != nil {
		return nil, status.Error(grpcCode(startStatus(err)), err.Error())
	}
	s, err := g.H.Sessions.Get(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "session %s started but is not tracked: %v", id, err)
	}
	return toProto(s), nil
}

// GetSession implements gatewayv1.GatewayServer.
func (g *GRPC) GetSession(ctx context.Context, req *gatewayv1.SessionRef) (*gatewayv1.Session, error) {
	s, err := g.lookup(ctx, req.Namespace, req.Id)
	if err != nil {
		return nil, err
	}
	return toProto(s), nil
}

// WaitSession implements gatewayv1.GatewayServer.
func (g *GRPC) WaitSession(ctx context.Context, req *gatewayv1.WaitSessionRequest) (*gatewayv1.SessionResult, error) {
	if _, err := g.lookup(ctx, req.Namespace, req.Id); err != nil {
		return nil, err
	}
	wait := min(time.Duration(req.TimeoutMs)*time.Millisecond, g.H.MaxWait)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	s, _ := g.H.Sessions.Wait(wctx, req.Id)
	out := &gatewayv1.SessionResult{Session: toProto(s)}
	if s.State != sessions.Completed || s.Result == nil {
		return out, nil
	}
	if s.Result.Size > MaxInlineResult {
		out.ResultStreamed = true
		return out, nil
	}
	body, err := g.H.Results.OpenResult(ctx, s.Namespace, s.Result)
	if err != nil {
		return nil, resultError(s, err)
	}
	defer body.Close()
	buf := make([]byte, s.Result.Size)
	if _, err := io.ReadFull(body, buf); err != nil {
		return nil, status.Errorf(codes.Unavailable, "read result %s/%s of session %s: %v", s.Result.Bucket, s.Result.Key, s.ID, err)
	}
	out.Result = buf
	// Handed whole to gRPC (which may yet fail to send it): the grace
	// starts, and the result stays readable until it ends or an ack.
	g.H.delivered(s)
	return out, nil
}

// AckResult implements gatewayv1.GatewayServer: the client has the
// session's result, whose objects may be freed now.
func (g *GRPC) AckResult(ctx context.Context, req *gatewayv1.AckResultRequest) (*gatewayv1.AckResultResponse, error) {
	s, err := g.lookup(ctx, req.Namespace, req.Id)
	if err != nil {
		return nil, err
	}
	if code, err := g.H.ack(s); err != nil {
		return nil, status.Error(grpcCode(code), err.Error())
	}
	return &gatewayv1.AckResultResponse{}, nil
}

func resultError(s sessions.Session, err error) error {
	code := codes.Unavailable
	if errors.Is(err, ErrResultGone) {
		code = codes.NotFound
	}
	return status.Errorf(code, "read result %s/%s of session %s: %v", s.Result.Bucket, s.Result.Key, s.ID, err)
}

// ReadResult implements gatewayv1.GatewayServer: the result in chunks, read
// from where it is held as the client takes them.
func (g *GRPC) ReadResult(req *gatewayv1.SessionRef, stream gatewayv1.Gateway_ReadResultServer) error {
	ctx := stream.Context()
	s, err := g.lookup(ctx, req.Namespace, req.Id)
	if err != nil {
		return err
	}
	switch s.State {
	case sessions.Running:
		return status.Errorf(codes.FailedPrecondition, "session %s is still running: wait for it first (WaitSession)", s.ID)
	case sessions.Failed:
		return status.Errorf(codes.FailedPrecondition, "session %s failed: %s", s.ID, s.Error)
	case sessions.Expired:
		return status.Errorf(codes.NotFound, "session %s expired before it completed", s.ID)
	}
	if s.Result == nil {
		return status.Errorf(codes.Internal, "session %s completed without a result object", s.ID)
	}
	body, err := g.H.Results.OpenResult(ctx, s.Namespace, s.Result)
	if err != nil {
		return resultError(s, err)
	}
	defer body.Close()
	var sent int64
	for {
		// A fresh buffer per message: gRPC may still hold a sent one
		// (stats handlers), so none is reused.
		buf := make([]byte, min(resultChunk, max(s.Result.Size-sent, 1)))
		n, err := io.ReadFull(body, buf)
		if n > 0 {
			if serr := stream.Send(&gatewayv1.ResultChunk{Data: buf[:n]}); serr != nil {
				return serr
			}
			sent += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			if sent != s.Result.Size {
				return status.Errorf(codes.Unavailable, "result of session %s ended after %d of %d bytes", s.ID, sent, s.Result.Size)
			}
			g.H.delivered(s)
			return nil
		}
		if err != nil {
			return status.Errorf(codes.Unavailable, "read result %s/%s of session %s after %d bytes: %v", s.Result.Bucket, s.Result.Key, s.ID, sent, err)
		}
	}
}

// WatchSession implements gatewayv1.GatewayServer: progress events until
// the session ends.
func (g *GRPC) WatchSession(req *gatewayv1.SessionRef, stream gatewayv1.Gateway_WatchSessionServer) error {
	if _, err := g.lookup(stream.Context(), req.Namespace, req.Id); err != nil {
		return err
	}
	sent := 0
	for {
		s, changed, err := g.H.Sessions.Watch(req.Id)
		if err != nil {
			return status.Error(codes.NotFound, err.Error())
		}
		sent = max(sent, s.FirstEvent)
		for _, e := range s.Events[sent-s.FirstEvent:] {
			if err := stream.Send(&gatewayv1.SessionEvent{UnixMs: e.Time.UnixMilli(), Kind: e.Kind, Message: e.Message, State: string(s.State)}); err != nil {
				return err
			}
		}
		sent = s.FirstEvent + len(s.Events)
		if s.State.Ended() {
			return nil
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}
