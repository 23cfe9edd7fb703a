// Package control is the operator's end of the control stream: every
// queue-proxy-zl sidecar connects, identifies itself, and reports object and
// function events; the server hands events to the trigger engine's adapter,
// gives each sidecar its namespace's reference keys, and sends GC and
// keep-alive commands to the sidecars of a namespace.
package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/control/controlv1"
)

// Identity is what a sidecar said about itself in its Hello.
type Identity struct {
	Namespace, Workflow, Function, Pod, Node, DataplaneAddr string
}

// Events receives what sidecars report. Implementations must be safe for
// concurrent use: every stream calls them from its own goroutine.
type Events interface {
	ObjectReady(ctx context.Context, from Identity, ev *controlv1.ObjectReady) error
	FunctionStarted(ctx context.Context, from Identity, ev *controlv1.FunctionStarted) error
	FunctionFinished(ctx context.Context, from Identity, ev *controlv1.FunctionFinished) error
}

// KeySource returns a namespace's reference keys, creating them if needed.
type KeySource interface {
	Keys(ctx context.Context, namespace string) (*controlv1.Keys, error)
}

// Server implements controlv1.ControlServer.
type Server struct {
	controlv1.UnimplementedControlServer
	events Events
	keys   KeySource
	// SendTimeout bounds how long a command waits for a slow sidecar before
	// that sidecar's stream is closed (it reconnects and resyncs).
	SendTimeout time.Duration
	// Log receives errors that do not end a stream (rejected events).
	Log func(error)

	mu    sync.RWMutex
	conns map[*conn]struct{}
}

type conn struct {
	id      Identity
	out     chan *controlv1.OperatorMessage
	gone    chan struct{}
	once    sync.Once
	acked   atomic.Uint64 // highest seq processed
	ackWake chan struct{}
}

func (c *conn) close() { c.once.Do(func() { close(c.gone) }) }

// NewServer returns a server that delivers events to ev and keys from keys.
func NewServer(ev Events, keys KeySource) *Server {
	return &Server{events: ev, keys: keys, SendTimeout: 5 * time.Second, conns: map[*conn]struct{}{}}
}

// Connect serves one sidecar's stream until it ends.
func (s *Server) Connect(stream controlv1.Control_ConnectServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "the first message of a control stream must be Hello")
	}
	if hello.Namespace == "" || hello.Pod == "" {
		return status.Error(codes.InvalidArgument, "Hello needs namespace and pod")
	}
	c := &conn{
		id:      Identity{Namespace: hello.Namespace, Workflow: hello.Workflow, Function: hello.Function, Pod: hello.Pod, Node: hello.Node, DataplaneAddr: hello.DataplaneAddr},
		out:     make(chan *controlv1.OperatorMessage, 256),
		gone:    make(chan struct{}),
		ackWake: make(chan struct{}, 1),
	}
	keys, err := s.keys.Keys(ctx, hello.Namespace)
	if err != nil {
		return status.Errorf(codes.Unavailable, "reference keys for namespace %s: %v", hello.Namespace, err)
	}
	if err := stream.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Keys{Keys: keys}}); err != nil {
		return err
	}

	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	connectedSidecars.Inc()
	defer connectedSidecars.Dec()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.close()
	}()

	// One goroutine owns Send; commands from any goroutine go through c.out.
	sendErr := make(chan error, 1)
	go func() {
		var sentAck uint64
		for {
			select {
			case m := <-c.out:
				if err := stream.Send(m); err != nil {
					sendErr <- err
					c.close()
					return
				}
			case <-c.ackWake:
				// Acks are coalesced: one message confirms everything so far.
				if seq := c.acked.Load(); seq > sentAck {
					if err := stream.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Ack{Ack: &controlv1.Ack{Seq: seq}}}); err != nil {
						sendErr <- err
						c.close()
						return
					}
					sentAck = seq
				}
			case <-c.gone:
				return
			case <-ctx.Done():
				return
			}
		}
	}()

	// Recv runs in its own goroutine so that a sidecar disconnected for
	// being too slow (c.gone) ends the stream even while Recv blocks.
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if err := s.dispatch(ctx, c.id, m); err != nil {
				recvErr <- err
				return
			}
			if m.Seq > 0 {
				c.acked.Store(m.Seq)
				select {
				case c.ackWake <- struct{}{}:
				default:
				}
			}
		}
	}()
	select {
	case err := <-recvErr:
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	case err := <-sendErr:
		return err
	case <-c.gone:
		return status.Error(codes.ResourceExhausted, "sidecar did not keep up with operator commands; reconnect")
	}
}

func (s *Server) dispatch(ctx context.Context, id Identity, m *controlv1.SidecarMessage) error {
	var err error
	switch msg := m.Msg.(type) {
	case *controlv1.SidecarMessage_ObjectReady:
		ev := msg.ObjectReady
		if ev.Bucket == "" || ev.Key == "" || ev.Session == "" {
			return status.Error(codes.InvalidArgument, "ObjectReady needs session, bucket and key")
		}
		if ev.Ref == "" && ev.Inline == nil {
			return status.Errorf(codes.InvalidArgument, "ObjectReady %s/%s carries neither a reference nor inline bytes", ev.Bucket, ev.Key)
		}
		err = s.events.ObjectReady(ctx, id, ev)
	case *controlv1.SidecarMessage_FunctionStarted:
		err = s.events.FunctionStarted(ctx, id, msg.FunctionStarted)
	case *controlv1.SidecarMessage_FunctionFinished:
		err = s.events.FunctionFinished(ctx, id, msg.FunctionFinished)
	case *controlv1.SidecarMessage_Hello:
		return status.Error(codes.InvalidArgument, "Hello may only be sent once, first")
	default:
		return status.Errorf(codes.InvalidArgument, "unknown sidecar message %T", m.Msg)
	}
	if err != nil {
		// One event the engine rejects (an unknown bucket, a session already
		// collected) must not tear down the stream that carries all others.
		eventErrors.Inc()
		if s.Log != nil {
			s.Log(fmt.Errorf("event from %s/%s rejected: %w", id.Namespace, id.Pod, err))
		}
	}
	return nil
}

// Sidecars lists the connected sidecars of a namespace.
func (s *Server) Sidecars(namespace string) []Identity {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var ids []Identity
	for c := range s.conns {
		if c.id.Namespace == namespace {
			ids = append(ids, c.id)
		}
	}
	return ids
}

// Drop tells every sidecar of the namespace to free a session's objects
// (keys empty) or the listed bucket/key objects.
func (s *Server) Drop(namespace, session string, keys []string) error {
	return s.broadcast(namespace, &controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Drop{Drop: &controlv1.DropObjects{Session: session, Keys: keys}}})
}

// KeepAlive tells the namespace's sidecars to extend the TTL of refs.
func (s *Server) KeepAlive(namespace string, refs []string, extend time.Duration) error {
	return s.broadcast(namespace, &controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_KeepAlive{KeepAlive: &controlv1.KeepAlive{Refs: refs, ExtendMs: extend.Milliseconds()}}})
}

// broadcast queues m for every sidecar of the namespace; a sidecar that
// cannot take it within SendTimeout is disconnected.
func (s *Server) broadcast(namespace string, m *controlv1.OperatorMessage) error {
	s.mu.RLock()
	var targets []*conn
	for c := range s.conns {
		if c.id.Namespace == namespace {
			targets = append(targets, c)
		}
	}
	s.mu.RUnlock()
	var errs []error
	for _, c := range targets {
		t := time.NewTimer(s.SendTimeout)
		select {
		case c.out <- m:
		case <-c.gone:
		case <-t.C:
			c.close()
			errs = append(errs, fmt.Errorf("sidecar %s/%s too slow, disconnected", c.id.Namespace, c.id.Pod))
		}
		t.Stop()
	}
	return errors.Join(errs...)
}
