// Package control is the operator's end of the control stream: every
// queue-proxy-zl sidecar connects, identifies itself, and reports object and
// function events; the server hands events to the trigger engine's adapter,
// gives each sidecar its namespace's reference keys, and sends GC and
// keep-alive commands to the sidecars of a namespace.
//
// Every call is authenticated (Server.Auth, TokenReviewer in production):
// a sidecar presents its pod's projected service-account token, and the
// stream is scoped to that token's namespace and pod. It gets only that
// namespace's keys, may report only events of that namespace's sessions
// and of its own pod's invocations, and receives only that namespace's
// commands. GetKeys serves other namespaces' keys only to allow-listed
// service accounts (Server.KeyReaders: activator-ext). docs/control-stream.md
// describes the model, its errors and metrics.
package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
	"github.com/ziptrail/ziptrail/internal/operator/directory"
)

// Identity is a sidecar's stream: Namespace and Pod are its token's
// (verified), PodUID and ServiceAccount too; Node is the token's too when
// it carries one (Caller.Node), else what the Hello said (a routing hint
// only); Workflow, Function and DataplaneAddr are what it said in its
// Hello.
type Identity struct {
	Namespace, Workflow, Function, Pod, Node, DataplaneAddr string
	PodUID, ServiceAccount                                  string
}

// SessionScope tells which namespace a session belongs to (ok false when
// the session is unknown). When the Events given to NewServer implement
// it, an event naming a session of another namespace than its sidecar's is
// refused; unknown sessions are left to the engine, which ignores them.
type SessionScope interface {
	SessionNamespace(session string) (namespace string, ok bool)
}

// Events receives what sidecars report. Implementations must be safe for
// concurrent use: every stream calls them from its own goroutine.
type Events interface {
	ObjectReady(ctx context.Context, from Identity, ev *controlv1.ObjectReady) error
	FunctionStarted(ctx context.Context, from Identity, ev *controlv1.FunctionStarted) error
	FunctionFinished(ctx context.Context, from Identity, ev *controlv1.FunctionFinished) error
}

// Durability is implemented by Events whose effects are saved after they
// are applied (the orchestrator's checkpoints). An event is acknowledged
// to its sidecar only once the channel Saved returns for it is closed (nil:
// at once); until then the sidecar keeps it and sends it again to
// whichever owner it connects to next, so that a crash of the operator
// loses no acknowledged event. Saved is called right after the event was
// applied, on the stream's goroutine: what it returns covers everything
// applied for from's workflow so far.
type Durability interface {
	Saved(from Identity) <-chan struct{}
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
	scope  SessionScope // nil when events does not implement it
	dur    Durability   // nil when events does not implement it
	// Auth verifies every caller's token. A server without one refuses
	// every call (there is no unauthenticated mode).
	Auth Authenticator
	// KeyReaders are the users (system:serviceaccount:<ns>:<sa>) that may
	// read any namespace's keys with GetKeys: activator-ext's
	// ServiceAccount, which opens the references of every namespace it
	// proxies for. Anyone else reads only its own pod's namespace.
	KeyReaders []string
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// SendTimeout bounds how long a command waits for a slow sidecar before
	// that sidecar's stream is closed (it reconnects and resyncs).
	SendTimeout time.Duration
	// Log receives errors that do not end a stream (rejected events).
	Log func(error)
	// Tiers, when set, are sent to every authenticated sidecar right after
	// its Hello is accepted, before its Keys: the storage tiers' endpoints
	// and credentials the operator was started with. They travel only over
	// this authenticated stream, never in a pod's annotations or env.
	Tiers *controlv1.Tiers
	// Groups is the messaging directory (docs/messaging.md); nil makes one.
	Groups *directory.Directory
	// StreamGrace is how long a pod whose stream ended has to reconnect
	// before its group members are announced gone (DefaultStreamGrace).
	StreamGrace time.Duration
	// Route, when set, sends a sidecar whose workflow another operator
	// replica owns there (route.go); nil serves every stream here.
	Route Router
	// Limits bound the callers of the server's port (limits.go); zero
	// fields take DefaultLimits. Set them before ServerOptions is called.
	Limits     guard.Limits
	guardOnce  sync.Once
	guard      *guard.Guard
	groupsOnce sync.Once

	mu       sync.RWMutex
	conns    map[*conn]struct{}
	podConns map[string]int // podKey -> open streams
	owners   *owners
	bySID    map[uint64]*conn
	nextSID  atomic.Uint64
}

// NewServer returns a server that delivers events to ev and keys from keys.
// Set Auth before serving: without it every call is refused.
func NewServer(ev Events, keys KeySource) *Server {
	s := &Server{events: ev, keys: keys, SendTimeout: 5 * time.Second, conns: map[*conn]struct{}{},
		podConns: map[string]int{}, owners: newOwners(), bySID: map[uint64]*conn{}}
	s.scope, _ = ev.(SessionScope)
	s.dur, _ = ev.(Durability)
	return s
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// podKey names a pod across its streams: its UID when the token has it (a
// pod recreated under the same name is another pod).
func podKey(id Identity) string {
	if id.PodUID != "" {
		return id.PodUID
	}
	return id.Namespace + "/" + id.Pod
}

// live reports whether the pod has a stream open.
func (s *Server) live(pod string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.podConns[pod] > 0
}

// Connect serves one sidecar's stream until it ends.
func (s *Server) Connect(stream controlv1.Control_ConnectServer) error {
	ctx := stream.Context()
	caller, err := s.caller(ctx)
	if err != nil {
		return err
	}
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
	switch {
	case caller.Pod == "" || caller.Namespace == "":
		rejected(ReasonNotPodBound)
		return status.Errorf(codes.PermissionDenied, "the token of %s is not bound to a pod: a sidecar presents the projected "+
			"service-account token its pod mounts for audience %q", caller, Audience)
	case hello.Namespace != caller.Namespace:
		rejected(ReasonForeignNamespace)
		return status.Errorf(codes.PermissionDenied, "Hello names namespace %q, but the token is %s's: a sidecar connects "+
			"only for its own pod's namespace", hello.Namespace, caller)
	case hello.Pod != caller.Pod:
		rejected(ReasonForeignPod)
		return status.Errorf(codes.PermissionDenied, "Hello names pod %q, but the token is %s's: a sidecar connects "+
			"only as its own pod", hello.Pod, caller)
	}
	// The node is the token's, signed by the API server. A token without
	// one (an API server older than 1.30) leaves the Hello's, which
	// nothing verifies: it is then a routing hint only (activator-ext's
	// locality preference), never a trust decision.
	node := caller.Node
	if node == "" {
		node = hello.Node
	}
	c := &conn{
		sid: s.nextSID.Add(1),
		id: Identity{Namespace: caller.Namespace, Workflow: hello.Workflow, Function: hello.Function, Pod: caller.Pod, Node: node,
			DataplaneAddr: hello.DataplaneAddr, PodUID: caller.PodUID, ServiceAccount: caller.ServiceAccount},
		out:     make(chan *controlv1.OperatorMessage, 256),
		gone:    make(chan struct{}),
		ackWake: make(chan struct{}, 1),
		moved:   make(chan struct{}),
	}
	if done, err := s.route(ctx, stream, c.id); done {
		return err
	}
	keys, err := s.keys.Keys(ctx, caller.Namespace)
	if err != nil {
		return status.Errorf(codes.Unavailable, "reference keys for namespace %s: %v", caller.Namespace, err)
	}
	if s.Tiers != nil {
		if err := stream.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Tiers{Tiers: s.Tiers}}); err != nil {
			return err
		}
	}
	if err := stream.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Keys{Keys: keys}}); err != nil {
		return err
	}
	// What this operator understands beyond the first version of the
	// protocol: a sidecar uses it only on a stream that announced it.
	if err := stream.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Features{Features: features}}); err != nil {
		return err
	}
	for _, m := range s.welcome(c) {
		if err := stream.Send(m); err != nil {
			return err
		}
	}

	pod := podKey(c.id)
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.bySID[c.sid] = c
	s.podConns[pod]++
	s.mu.Unlock()
	connectedSidecars.Inc()
	defer connectedSidecars.Dec()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		delete(s.bySID, c.sid)
		if s.podConns[pod]--; s.podConns[pod] <= 0 {
			delete(s.podConns, pod)
		}
		s.mu.Unlock()
		c.close()
		c.dropPending()
		s.streamEnded(c)
	}()

	// The stream lives no longer than its token: the sidecar reconnects
	// with the one the kubelet rotated in meanwhile.
	var expired <-chan time.Time
	if !caller.Expires.IsZero() {
		t := time.NewTimer(caller.Expires.Sub(s.now()))
		defer t.Stop()
		expired = t.C
	}

	// One goroutine owns Send; commands from any goroutine go through c.out.
	sendErr := make(chan error, 1)
	go func() {
		var sentAck uint64
		var saved <-chan struct{} // what the next acknowledgement waits for
		for {
			ack := false
			select {
			case m := <-c.out:
				if err := stream.Send(m); err != nil {
					sendErr <- err
					c.close()
					return
				}
			case <-c.ackWake:
				ack = true
			case <-saved: // nil: never
				ack = true
			case <-c.moved:
				if err := stream.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Redirect{Redirect: c.redirect}}); err != nil {
					sendErr <- err
				} else {
					sendErr <- movedErr(c)
				}
				c.close()
				return
			case <-c.gone:
				return
			case <-ctx.Done():
				return
			}
			if ack {
				// Acks are coalesced: one message confirms everything
				// saved so far.
				var seq uint64
				seq, saved = c.ackable()
				if seq > sentAck {
					if err := stream.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Ack{Ack: &controlv1.Ack{Seq: seq}}}); err != nil {
						sendErr <- err
						c.close()
						return
					}
					sentAck = seq
				}
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
			if err := s.receive(ctx, c, m); err != nil {
				recvErr <- err
				return
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
		select {
		case <-c.moved:
			return movedErr(c)
		default:
		}
		return status.Error(codes.ResourceExhausted, "sidecar did not keep up with operator commands; reconnect")
	case <-expired:
		return status.Errorf(codes.Unauthenticated, "the stream's token expired at %s: reconnect with the current token",
			caller.Expires.UTC().Format(time.RFC3339))
	}
}

func (s *Server) dispatch(ctx context.Context, c *conn, m *controlv1.SidecarMessage) error {
	id := c.id
	var err error
	switch msg := m.Msg.(type) {
	case *controlv1.SidecarMessage_ObjectReady:
		events.WithLabelValues("object_ready").Inc()
		ev := msg.ObjectReady
		if ev.Bucket == "" || ev.Key == "" || ev.Session == "" {
			return status.Error(codes.InvalidArgument, "ObjectReady needs session, bucket and key")
		}
		if ev.Ref == "" && ev.Inline == nil {
			return status.Errorf(codes.InvalidArgument, "ObjectReady %s/%s carries neither a reference nor inline bytes", ev.Bucket, ev.Key)
		}
		if s.refuse(c, m.Seq, ev.Session, ev.InvocationId, false, fmt.Sprintf("ObjectReady %s/%s", ev.Bucket, ev.Key)) {
			return nil
		}
		err = s.events.ObjectReady(ctx, id, ev)
	case *controlv1.SidecarMessage_FunctionStarted:
		events.WithLabelValues("function_started").Inc()
		ev := msg.FunctionStarted
		if s.refuse(c, m.Seq, ev.Session, ev.InvocationId, false, "FunctionStarted") {
			return nil
		}
		err = s.events.FunctionStarted(ctx, id, ev)
	case *controlv1.SidecarMessage_FunctionFinished:
		events.WithLabelValues("function_finished").Inc()
		ev := msg.FunctionFinished
		if s.refuse(c, m.Seq, ev.Session, ev.InvocationId, true, "FunctionFinished") {
			return nil
		}
		err = s.events.FunctionFinished(ctx, id, ev)
	case *controlv1.SidecarMessage_GroupJoin:
		events.WithLabelValues("group_join").Inc()
		s.groupJoin(c, msg.GroupJoin)
		return nil
	case *controlv1.SidecarMessage_GroupLeave:
		events.WithLabelValues("group_leave").Inc()
		s.groupLeave(c, msg.GroupLeave)
		return nil
	case *controlv1.SidecarMessage_Hello:
		return status.Error(codes.InvalidArgument, "Hello may only be sent once, first")
	default:
		return status.Errorf(codes.InvalidArgument, "unknown sidecar message %T", m.Msg)
	}
	if errors.Is(err, ErrMoved) {
		// Not acknowledged: the sidecar sends it again to the owner.
		return status.Errorf(codes.Unavailable, "event from %s/%s: %v: reconnect", id.Namespace, id.Pod, err)
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

// refuse checks that an event of c's sidecar names a session of its own
// namespace and an invocation of its own pod. A refused event is counted,
// logged, reported to the sidecar (Rejected) and acknowledged: sending it
// again would be refused again, and the stream carries the pod's other
// events on.
func (s *Server) refuse(c *conn, seq uint64, session, invocation string, finished bool, what string) bool {
	var reason, msg string
	if s.scope != nil && session != "" {
		if ns, ok := s.scope.SessionNamespace(session); ok && ns != c.id.Namespace {
			reason = ReasonForeignSession
			msg = fmt.Sprintf("%s names session %q of another namespace: pod %s/%s reports only sessions of namespace %s",
				what, session, c.id.Namespace, c.id.Pod, c.id.Namespace)
		}
	}
	if reason == "" && invocation != "" {
		if owner, ok := s.owners.claim(c.id.Namespace, invocation, podKey(c.id), finished, s.now(), s.live); !ok {
			reason = ReasonForeignInvocation
			msg = fmt.Sprintf("%s names invocation %q, which another pod (%s) reported and still serves: pod %s/%s reports only its own invocations",
				what, invocation, owner, c.id.Namespace, c.id.Pod)
		}
	}
	if reason == "" {
		return false
	}
	rejected(reason)
	if s.Log != nil {
		s.Log(fmt.Errorf("event from %s/%s refused: %s", c.id.Namespace, c.id.Pod, msg))
	}
	select { // best effort: a sidecar too slow for it learns nothing more
	case c.out <- &controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Rejected{Rejected: &controlv1.Rejected{
		Seq: seq, Code: int32(codes.PermissionDenied), Message: msg}}}:
	default:
	}
	return true
}

// GetKeys returns a namespace's reference keys to an allow-listed reader
// (KeyReaders) or to a pod of that namespace.
func (s *Server) GetKeys(ctx context.Context, req *controlv1.GetKeysRequest) (*controlv1.Keys, error) {
	caller, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	if req.Namespace == "" {
		return nil, status.Error(codes.InvalidArgument, "GetKeys needs a namespace")
	}
	if !slices.Contains(s.KeyReaders, caller.Username) && (caller.Pod == "" || caller.Namespace != req.Namespace) {
		rejected(ReasonKeysForbidden)
		return nil, status.Errorf(codes.PermissionDenied, "%s may not read the reference keys of namespace %q: only the "+
			"operator's key readers (--control-key-readers, e.g. activator-ext's ServiceAccount) read other namespaces' keys, "+
			"and a pod only its own namespace's", caller, req.Namespace)
	}
	keys, err := s.keys.Keys(ctx, req.Namespace)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "reference keys for namespace %s: %v", req.Namespace, err)
	}
	return keys, nil
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

// ReleaseKept tells each listed pod of the namespace that the reports it
// kept under the ids are saved (controlclient/kept.go). It does not wait:
// a sidecar whose queue is full is disconnected, and sends its kept
// reports to the stream it opens next.
func (s *Server) ReleaseKept(namespace string, byPod map[string][]uint64) {
	s.mu.RLock()
	var targets []*conn
	var ids [][]uint64
	for c := range s.conns {
		if c.id.Namespace == namespace {
			if k, ok := byPod[c.id.Pod]; ok {
				targets, ids = append(targets, c), append(ids, k)
			}
		}
	}
	s.mu.RUnlock()
	for i, c := range targets {
		s.sendTo(c, &controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Saved{Saved: &controlv1.Saved{Kept: ids[i]}}})
	}
}

// KeepAlive tells the namespace's sidecars to extend the TTL of refs.
func (s *Server) KeepAlive(namespace string, refs []string, extend time.Duration) error {
	return s.broadcast(namespace, &controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_KeepAlive{KeepAlive: &controlv1.KeepAlive{Refs: refs, ExtendMs: extend.Milliseconds()}}})
}

// broadcast queues m for every sidecar of the namespace; a sidecar that
// cannot take it within SendTimeout is disconnected.
func (s *Server) broadcast(namespace string, m *controlv1.OperatorMessage) error {
	return s.send(func(id Identity) bool { return id.Namespace == namespace }, m)
}

// send queues m for every sidecar to; see broadcast.
func (s *Server) send(to func(Identity) bool, m *controlv1.OperatorMessage) error {
	s.mu.RLock()
	var targets []*conn
	for c := range s.conns {
		if to(c.id) {
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
