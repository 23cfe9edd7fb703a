package sidecar

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// newRouter makes the pod's messaging router (docs/messaging.md): the
// directory over the control stream, deliveries over the pull client's
// connections, mailboxes in the fast tier.
func (s *Sidecar) newRouter() *messaging.Router {
	cfg := messaging.Config{
		Self:      s.addr(),
		Keys:      func() *ref.Keyring { return s.keys.Load() },
		Mailbox:   liveMailbox{s},
		InlineMax: s.cfg.InlineThreshold,
		// A large incoming message lands in a file of the object
		// directory, which the receiving function maps: one of the local
		// API's reused files once it runs (localapi/msgfiles.go).
		NewFile: func(size int64) (messaging.File, error) {
			if api := s.apiFiles.Load(); api != nil {
				return api.MessageFile(size)
			}
			return localapi.NewMessageFile(s.cfg.ShmDir, size)
		},
	}
	s.directConfig(&cfg)
	if s.cfg.OperatorAddr != "" {
		cfg.Control = func(m *controlv1.SidecarMessage) error {
			if s.ctl == nil {
				return messaging.ErrNoDirectory
			}
			return s.ctl.Send(m)
		}
	}
	return messaging.New(cfg)
}

// liveMailbox is the fast tier's mailbox, with the tier the operator sent.
type liveMailbox struct{ s *Sidecar }

var errNoFastTier = errors.New("the group keeps mailboxes in the fast tier, and none is configured")

func (l liveMailbox) box() (*messaging.RedisMailbox, error) {
	r := l.s.redis.Load()
	if r == nil {
		return nil, errNoFastTier
	}
	return &messaging.RedisMailbox{Client: r.Client, Namespace: l.s.cfg.Namespace, TTL: l.s.cfg.ObjectTTL}, nil
}

func (l liveMailbox) Push(ctx context.Context, session, group string, rank uint32, m messaging.Message) error {
	b, err := l.box()
	if err != nil {
		return err
	}
	return b.Push(ctx, session, group, rank, m)
}

func (l liveMailbox) Take(ctx context.Context, session, group string, rank uint32) ([]messaging.Message, error) {
	b, err := l.box()
	if err != nil {
		return nil, err
	}
	return b.Take(ctx, session, group, rank)
}

// drainGroups keeps a terminating sidecar serving while group members run
// in its pod (Terminating logged them), until the last one leaves or
// groupDrain passes.
func (s *Sidecar) drainGroups() {
	if s.msgs.Live() == 0 {
		return
	}
	limit := s.groupDrain()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	if err := s.msgs.WaitIdle(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "queue-proxy-zl: %d group member(s) still running after %s; stopping anyway\n", s.msgs.Live(), limit)
		return
	}
	fmt.Fprintf(os.Stderr, "queue-proxy-zl: the last group member left; stopping\n")
}

// groupDrain bounds how long a terminating sidecar keeps serving its
// live group members (GroupDrainTimeout, default 10 minutes: Kubernetes'
// grace period, Knative's revision timeout, ends it first).
func (s *Sidecar) groupDrain() time.Duration {
	if s.cfg.GroupDrainTimeout > 0 {
		return s.cfg.GroupDrainTimeout
	}
	return 10 * time.Minute
}
