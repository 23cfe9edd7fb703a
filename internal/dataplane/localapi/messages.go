package localapi

import (
	"context"
	"time"

	"github.com/ziptrail/ziptrail/internal/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// The messaging calls (docs/messaging.md): the function's side of
// messaging.Router. Large messages go as objects of this pod's store,
// read once, which the receiver's sidecar pulls into its own pod's
// shared memory when its instance receives them.

// messageInline is the largest message sent inside the delivery itself.
const messageInline = 256 << 10

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
	data, release, err := s.load(ctx, req.GetData())
	if err != nil {
		return nil, toStatus(err)
	}
	defer release()
	out := messaging.Outgoing{Session: req.GetSession(), Group: req.GetGroup(), From: req.GetFrom(), To: req.GetTo(), Tag: req.GetTag(), Data: data}
	var stored string
	if len(data) > messageInline {
		// Large: an object of this pod, read once by the receiver's
		// sidecar (or by the tiers' copy if this pod is gone by then).
		stored = s.newID("msg")
		m := store.Meta{ID: stored, Session: req.GetSession(), Reads: 1, Expires: s.now().Add(s.ttl(0))}
		if out.Ref, err = s.put(ctx, m, data); err != nil {
			return nil, toStatus(err)
		}
		out.Data, out.Size = nil, uint64(len(data))
	}
	mailboxed, err := r.Send(ctx, out)
	if err != nil {
		if stored != "" {
			s.Store.Remove(stored)
		}
		return nil, toStatus(err)
	}
	return &sidecarv1.SendResponse{Mailboxed: mailboxed}, nil
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
	resp := &sidecarv1.RecvResponse{From: m.From, Tag: m.Tag, Size: int64(m.Size)}
	if m.Ref == "" {
		resp.Data, resp.Size = inlinePayload(m.Data), int64(len(m.Data))
		return resp, nil
	}
	// The sender's pod holds it: pull it into this pod's shared memory.
	payload, size, err := s.fetch(context.WithoutCancel(ctx), m.Ref)
	if err != nil {
		return nil, toStatus(err)
	}
	resp.Data, resp.Size = payload, size
	return resp, nil
}
