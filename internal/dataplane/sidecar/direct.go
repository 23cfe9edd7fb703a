package sidecar

import (
	"context"
	"net"
	"os"

	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
)

// Same-node direct channels (docs/messaging.md): with the node directory
// configured (SameNodeConfig), this pod brokers direct channels between
// its attached group members and same-node senders on its node messaging
// socket, <dir>/<pod UID>.msg.sock, and asks the other pods' sockets for
// its own members' channels.

// directConfig fills the router's direct-channel part: across nodes (a
// TCP connection on the data-plane port, unless DirectTCP is off) and on
// one node (the node directory).
func (s *Sidecar) directConfig(cfg *messaging.Config) {
	if !s.cfg.NoDirectTCP {
		cfg.OpenTCP = func(ctx context.Context, addr, auth, session, group string, from, to uint32) (*os.File, error) {
			return directmsg.OpenTCP(ctx, addr, directmsg.OpenRequest{Auth: auth, Session: session, Group: group, From: from, To: to}, messaging.ErrNoDirect)
		}
	}
	c := s.cfg.SameNode
	if !c.enabled() {
		return
	}
	cfg.Node = c.Node
	cfg.OpenDirect = func(ctx context.Context, podUID, auth, session, group string, from, to uint32) (*os.File, error) {
		return directmsg.Open(ctx, c.Dir, podUID, directmsg.OpenRequest{Auth: auth, Session: session, Group: group, From: from, To: to}, messaging.ErrNoDirect)
	}
}

// tcpOpens answers opens across nodes on the data-plane port (nil with
// DirectTCP off: such connections are closed, their senders use the
// sidecars).
func (s *Sidecar) tcpOpens() func(net.Conn) {
	if s.cfg.NoDirectTCP {
		return nil
	}
	b := &directmsg.TCPBroker{
		Check: func(q directmsg.OpenRequest) error { return s.msgs.CheckAuth(q.Auth, q.Session, q.Group) },
		Peer: func(q directmsg.OpenRequest, remote *net.TCPAddr) error {
			return s.msgs.CheckPeer(q.Session, q.Group, q.From, remote)
		},
		Offer: func(q directmsg.OpenRequest, f *os.File) error {
			return s.msgs.OfferTCP(q.Session, q.Group, q.From, q.To, f)
		},
	}
	return b.Serve
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
