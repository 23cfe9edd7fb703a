package control

// A stream's messages as they arrive: one event, or several in one Events
// message (docs/control-stream.md, "One message a step").

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// features are what this server announces on every stream it accepts.
var features = &controlv1.Features{Events: true}

// maxEvents bounds the events of one Events message.
const maxEvents = 256

// receive handles one message of c's stream: an event, or Events, each of
// which is handled as if it came alone, in order.
func (s *Server) receive(ctx context.Context, c *conn, m *controlv1.SidecarMessage) error {
	evs := []*controlv1.SidecarMessage{m}
	if batch, ok := m.Msg.(*controlv1.SidecarMessage_Events); ok {
		events.WithLabelValues("events").Inc()
		if err := checkEvents(m, batch.Events); err != nil {
			return err
		}
		evs = batch.Events.Events
	}
	for _, ev := range evs {
		if err := s.dispatch(ctx, c, ev); err != nil {
			return err
		}
		if ev.Seq > 0 {
			var saved <-chan struct{}
			if s.dur != nil {
				saved = s.dur.Saved(c.id)
			}
			c.processed(ev.Seq, saved)
		}
	}
	return nil
}

// checkEvents refuses an Events message that is not what a sidecar sends:
// a seq of its own, none or too many events, an event without a seq or
// out of order, a Hello or Events inside.
func checkEvents(m *controlv1.SidecarMessage, b *controlv1.Events) error {
	switch {
	case m.Seq != 0:
		return status.Error(codes.InvalidArgument, "Events carries no seq of its own: each of its events does")
	case len(b.Events) == 0:
		return status.Error(codes.InvalidArgument, "Events without events")
	case len(b.Events) > maxEvents:
		return status.Errorf(codes.InvalidArgument, "Events with %d events: at most %d", len(b.Events), maxEvents)
	}
	var last uint64
	for _, ev := range b.Events {
		switch ev.Msg.(type) {
		case *controlv1.SidecarMessage_Hello, *controlv1.SidecarMessage_Events:
			return status.Errorf(codes.InvalidArgument, "Events may not hold %T", ev.Msg)
		}
		if ev.Seq <= last {
			return status.Errorf(codes.InvalidArgument, "Events holds seq %d after %d: each event needs a seq, in increasing order", ev.Seq, last)
		}
		last = ev.Seq
	}
	return nil
}
