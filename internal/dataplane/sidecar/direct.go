package sidecar

import (
	"context"
	"os"

	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
)

// Same-node direct channels (docs/messaging.md): with the node directory
// configured (SameNodeConfig), this pod brokers direct channels between
// its attached group members and same-node senders on its node messaging
// socket, <dir>/<pod UID>.msg.sock, and asks the other pods' sockets for
// its own members' channels.

// directConfig fills the router's same-node part.
func (s *Sidecar) directConfig(cfg *messaging.Config) {
	c := s.cfg.SameNode
	if !c.enabled() {
		return
	}
	cfg.Node = c.Node
	cfg.OpenDirect = func(ctx context.Context, podUID, auth, session, group string, from, to uint32) (*os.File, error) {
		return directmsg.Open(ctx, c.Dir, podUID, directmsg.OpenRequest{Auth: auth, Session: session, Group: group, From: from, To: to}, messaging.ErrNoDirect)
	}
}

// startDirect listens on the node messaging socket; a failure leaves this
// pod's members on the sidecar path (opens to it find no socket).
func (s *Sidecar) startDirect() {
	c := s.cfg.SameNode
	if !c.enabled() {
		return
	}
	b := &directmsg.Broker{
		Check: func(q directmsg.OpenRequest) error { return s.msgs.CheckAuth(q.Auth, q.Session, q.Group) },
		Offer: func(q directmsg.OpenRequest) (*os.File, error) {
			return s.msgs.OfferDirect(q.Session, q.Group, q.From, q.To)
		},
	}
	if err := b.Listen(c.Dir, c.PodUID); err != nil {
		s.logf("same-node direct messages off: %v", err)
		return
	}
	s.direct = b
	go b.Serve()
}

func (s *Sidecar) stopDirect() {
	if s.direct != nil {
		s.direct.Close()
	}
}
