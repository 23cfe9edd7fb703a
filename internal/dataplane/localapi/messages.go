package localapi

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// The messaging calls (docs/messaging.md): the function's side of
// messaging.Router. A large message is a file of the object directory at
// both ends: the sender's is streamed to the receiver's sidecar, which
// writes it into a new file that the receiving function maps.

func (s *Server) router() (*messaging.Router, error) {
	if s.Messages == nil {
		return nil, messaging.ErrNoDirectory
	}
	return s.Messages, nil
}

// withTimeout applies a request's timeout_ms (0: the call's own deadline).
func withTimeout(ctx context.Context, ms int64) (context.Context, context.CancelFunc) {
	if ms > 0 {
		return context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
	}
	return context.WithCancel(ctx)
}

func members(v *controlv1.GroupView) *sidecarv1.MembersResponse {
	live := make([]uint32, len(v.Members))
	for i, m := range v.Members {
		live[i] = m.Rank
	}
	return &sidecarv1.MembersResponse{Size: v.Size, Live: live, Gone: v.Gone, Epoch: v.Epoch, Mailbox: v.Mailbox}
}

func (s *Server) Join(ctx context.Context, req *sidecarv1.JoinRequest) (*sidecarv1.MembersResponse, error) {
	r, err := s.router()
	if err != nil {
		return nil, toStatus(err)
	}
	ctx, cancel := withTimeout(ctx, req.GetTimeoutMs())
	defer cancel()
	v, err := r.Join(ctx, req.GetSession(), req.GetGroup(), req.GetRank(), req.GetSize(), req.GetMailbox(), req.GetInvocationId(), req.GetWaitAll())
	if v == nil {
		return nil, toStatus(err)
	}
	resp := members(v)
	return resp, toStatus(err)
}

func (s *Server) Leave(_ context.Context, req *sidecarv1.LeaveRequest) (*sidecarv1.LeaveResponse, error) {
	r, err := s.router()
	if err == nil {
		err = r.Leave(req.GetSession(), req.GetGroup(), req.GetRank())
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return &sidecarv1.LeaveResponse{}, nil
}

func (s *Server) Members(ctx context.Context, req *sidecarv1.MembersRequest) (*sidecarv1.MembersResponse, error) {
	r, err := s.router()
	if err != nil {
		return nil, toStatus(err)
	}
	ctx, cancel := withTimeout(ctx, req.GetTimeoutMs())
	defer cancel()
	v, err := r.Members(ctx, req.GetSession(), req.GetGroup(), req.GetAfterEpoch())
	if err != nil {
		return nil, toStatus(err)
	}
	return members(v), nil
}

func (s *Server) Send(ctx context.Context, req *sidecarv1.SendRequest) (*sidecarv1.SendResponse, error) {
	r, err := s.router()
	if err != nil {
		return nil, toStatus(err)
	}
	ctx, cancel := withTimeout(ctx, req.GetTimeoutMs())
	defer cancel()
	out := messaging.Outgoing{Session: req.GetSession(), Group: req.GetGroup(), From: req.GetFrom(), To: req.GetTo(), Tag: req.GetTag()}
	mailboxed, err := s.send(ctx, r, out, req.GetData())
	if err != nil {
		return nil, toStatus(err)
	}
	return &sidecarv1.SendResponse{Mailboxed: mailboxed}, nil
}

// send sends a message whose bytes are inline or a payload file of the
// object directory (which the sidecar takes over: it streams the file to
// the receiver's sidecar, then removes it).
func (s *Server) send(ctx context.Context, r *messaging.Router, out messaging.Outgoing, p *sidecarv1.Payload) (bool, error) {
	switch src := p.GetSource().(type) {
	case *sidecarv1.Payload_Inline:
		out.Data = src.Inline
		if out.Data == nil {
			out.Data = []byte{}
		}
	case *sidecarv1.Payload_Path:
		mailboxed, _, err := s.sendFile(ctx, r, out, src.Path, false)
		return mailboxed, err
	default:
		return false, fmt.Errorf("%w: neither inline bytes nor a file", ErrBadPayload)
	}
	return r.Send(ctx, out)
}

// sendFile sends the object directory's file at path as the message's
// body, then removes it, or, with giveBack, leaves it to the client that
// wrote it (returned) once it was sent: the client writes its next
// message into it (msgfiles.go). A send that failed removes it.
func (s *Server) sendFile(ctx context.Context, r *messaging.Router, out messaging.Outgoing, path string, giveBack bool) (mailboxed, returned bool, err error) {
	f, st, err := invocation.OpenInDir(s.Dir, path)
	if err != nil {
		return false, false, fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	out.File, out.Size = f, uint64(st.Size())
	mailboxed, err = r.Send(ctx, out)
	_ = f.Close()
	if err != nil || !giveBack {
		_ = os.Remove(f.Name())
		return mailboxed, false, err
	}
	return mailboxed, true, nil
}

func (s *Server) Recv(ctx context.Context, req *sidecarv1.RecvRequest) (*sidecarv1.RecvResponse, error) {
	r, err := s.router()
	if err != nil {
		return nil, toStatus(err)
	}
	ctx, cancel := withTimeout(ctx, req.GetTimeoutMs())
	defer cancel()
	m, err := r.Recv(ctx, req.GetSession(), req.GetGroup(), req.GetRank(), messaging.Filter{
		AnySource: req.GetAnySource(), From: req.GetFrom(), AnyTag: req.GetAnyTag(), Tag: req.GetTag()})
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &sidecarv1.RecvResponse{From: m.From, Tag: m.Tag, Size: int64(m.Size), Data: inlinePayload(m.Data)}
	if m.Path != "" {
		// A large message is already a file of the object directory.
		m.HandOut(false)
		resp.Data = pathPayload(m.Path)
	}
	return resp, nil
}
