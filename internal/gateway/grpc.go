package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ziptrail/ziptrail/internal/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/sessions"
)

// MaxInlineResult is the largest result WaitSession returns in its answer;
// larger ones stream through ReadResult.
const MaxInlineResult = 1 << 20

// resultChunk is the size of ReadResult's messages.
const resultChunk = 256 << 10

// GRPC serves the gateway over gRPC with the same semantics as the HTTP API.
// The server must accept messages of Handler.MaxInput plus a little (see
// ServerOptions).
type GRPC struct {
	gatewayv1.UnimplementedGatewayServer
	H *Handler
	// Owners, when set, forward calls about workflows another operator
	// replica serves to its gRPC gateway (grpcproxy.go).
	Owners Owners

	connsMu sync.Mutex
	conns   map[string]*grpc.ClientConn
}

// ServerOptions are the grpc.Server options the gateway needs: inputs up
// to Handler.MaxInput arrive in one StartSession message, and a call
// without a bearer token is refused before its message is read (so nobody
// anonymous makes the server take in such messages).
func (g *GRPC) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(int(g.H.MaxInput) + 1<<20), grpc.InTapHandle(requireBearer),
		grpc.UnaryInterceptor(g.unaryRoute), grpc.StreamInterceptor(g.streamRoute)}
}

// requireBearer runs before a call's message is read.
func requireBearer(ctx context.Context, info *tap.Info) (context.Context, error) {
	for _, v := range info.Header.Get("authorization") {
		if bearer(v) != "" {
			return ctx, nil
		}
	}
	return ctx, status.Error(codes.Unauthenticated, "the session gateway needs Kubernetes credentials: send a bearer token (authorization: Bearer <token>)")
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
	case http.StatusRequestEntityTooLarge:
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
	id, err := g.H.Starter.Start(ctx, req.Namespace, req.Workflow, bytes.NewReader(req.Input), int64(len(req.Input)))
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
	return out, nil
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
