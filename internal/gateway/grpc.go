package gateway

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/sessions"
)

// GRPC serves the gateway over gRPC with the same semantics as the HTTP API.
type GRPC struct {
	gatewayv1.UnimplementedGatewayServer
	H *Handler
}

func toProto(s sessions.Session) *gatewayv1.Session {
	p := &gatewayv1.Session{Id: s.ID, Namespace: s.Namespace, Workflow: s.Workflow, State: string(s.State),
		StartedUnixMs: s.Started.UnixMilli(), Invocations: int32(s.Invocations), Objects: int32(s.Objects), Error: s.Error}
	if s.Ended != nil {
		p.EndedUnixMs = s.Ended.UnixMilli()
	}
	if s.Result != nil {
		p.ResultBucket, p.ResultKey = s.Result.Bucket, s.Result.Key
	}
	return p
}

func (g *GRPC) lookup(ns, id string) (sessions.Session, error) {
	s, err := g.H.Sessions.Get(id)
	if err != nil || s.Namespace != ns {
		return s, status.Errorf(codes.NotFound, "session %s not found in namespace %s", id, ns)
	}
	return s, nil
}

// StartSession implements gatewayv1.GatewayServer.
func (g *GRPC) StartSession(ctx context.Context, req *gatewayv1.StartSessionRequest) (*gatewayv1.Session, error) {
	if int64(len(req.Input)) > g.H.MaxInput {
		return nil, status.Errorf(codes.ResourceExhausted, "input exceeds %d bytes", g.H.MaxInput)
	}
	id, err := g.H.Starter.StartSession(ctx, req.Namespace, req.Workflow, req.Input)
	switch {
	case errors.Is(err, ErrWorkflowNotFound):
		return nil, status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrWorkflowNotReady):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case err != nil:
		return nil, status.Error(codes.Internal, err.Error())
	}
	s, err := g.lookup(req.Namespace, id)
	if err != nil {
		return nil, err
	}
	return toProto(s), nil
}

// GetSession implements gatewayv1.GatewayServer.
func (g *GRPC) GetSession(_ context.Context, req *gatewayv1.SessionRef) (*gatewayv1.Session, error) {
	s, err := g.lookup(req.Namespace, req.Id)
	if err != nil {
		return nil, err
	}
	return toProto(s), nil
}

// WaitSession implements gatewayv1.GatewayServer.
func (g *GRPC) WaitSession(ctx context.Context, req *gatewayv1.WaitSessionRequest) (*gatewayv1.SessionResult, error) {
	if _, err := g.lookup(req.Namespace, req.Id); err != nil {
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
	body, err := g.H.Results.OpenResult(ctx, s.Namespace, s.Result)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read result %s/%s: %v", s.Result.Bucket, s.Result.Key, err)
	}
	defer body.Close()
	if out.Result, err = io.ReadAll(body); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return out, nil
}

// WatchSession implements gatewayv1.GatewayServer: progress events until
// the session ends.
func (g *GRPC) WatchSession(req *gatewayv1.SessionRef, stream gatewayv1.Gateway_WatchSessionServer) error {
	if _, err := g.lookup(req.Namespace, req.Id); err != nil {
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
