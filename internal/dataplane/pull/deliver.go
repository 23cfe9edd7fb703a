package pull

import (
	"context"
	"errors"
	"fmt"

	dp "github.com/ziptrail/ziptrail/internal/dataplane/capnp"
)

// Message is a direct message between function instances, as one sidecar
// delivers it to another (package messaging builds and checks them).
type Message struct {
	Auth           string // sealed with the namespace's key by the sender's sidecar
	Session, Group string
	From, To       uint32
	Tag            int64
	Seq            uint64 // per sender and receiver, from 1
	Data           []byte // small messages; owned by the receiver
	Ref            string // large messages: a reference to pull
	Size           uint64
}

// DeliverStatus is the receiver's answer to a delivery.
type DeliverStatus = dp.DeliverStatus

// The answers of a delivery.
const (
	Queued  = dp.DeliverStatus_queued
	NotHere = dp.DeliverStatus_notHere
	Foreign = dp.DeliverStatus_foreign
)

// Deliverer queues the messages a Server receives. Accept runs in the
// order messages arrive on a connection and must not block; when the
// receiver's queue is full it returns a wait, which the server runs after
// releasing the connection's order (other callers go on) and before it
// answers, so a full receiver holds its sender back.
type Deliverer interface {
	Accept(m Message) (status DeliverStatus, wait func(context.Context) error)
}

// ErrNoMessaging: the peer sidecar does not take messages.
var ErrNoMessaging = errors.New("the peer's sidecar does not take direct messages")

func (p *producer) Deliver(ctx context.Context, call dp.Producer_deliver) error {
	d := p.s.Messages
	if d == nil {
		return ErrNoMessaging
	}
	in, err := call.Args().Msg()
	if err != nil {
		return err
	}
	m := Message{From: in.From(), To: in.To(), Tag: in.Tag(), Seq: in.Seq(), Size: in.Size()}
	if m.Auth, err = in.Auth(); err == nil {
		if m.Session, err = in.Session(); err == nil {
			if m.Group, err = in.Group(); err == nil {
				m.Ref, err = in.Ref()
			}
		}
	}
	if err != nil {
		return err
	}
	data, err := in.Data()
	if err != nil {
		return err
	}
	if len(data) > 0 {
		// The frame's buffer goes back to the transport after the call.
		m.Data = append([]byte(nil), data...)
	}
	status, wait := d.Accept(m)
	if wait != nil {
		call.Go()
		if err := wait(ctx); err != nil {
			return err
		}
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetStatus(status)
	return nil
}

// Deliver sends a message to the sidecar at addr over the connection
// pulls use (one per peer, kept open); it returns once the receiver queued
// it, or with its status when it did not.
func (c *Client) Deliver(ctx context.Context, addr string, m Message) (DeliverStatus, error) {
	prod, err := c.producer(ctx, addr)
	if err != nil {
		return 0, err
	}
	fut, release := prod.Deliver(ctx, func(p dp.Producer_deliver_Params) error {
		out, err := p.NewMsg()
		if err != nil {
			return err
		}
		out.SetFrom(m.From)
		out.SetTo(m.To)
		out.SetTag(m.Tag)
		out.SetSeq(m.Seq)
		out.SetSize(m.Size)
		for _, set := range []func() error{
			func() error { return out.SetAuth(m.Auth) }, func() error { return out.SetSession(m.Session) },
			func() error { return out.SetGroup(m.Group) }, func() error { return out.SetRef(m.Ref) },
			func() error { return out.SetData(m.Data) },
		} {
			if err := set(); err != nil {
				return err
			}
		}
		return nil
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, c.classify(addr, fmt.Errorf("deliver: %w", err))
	}
	return res.Status(), nil
}
