package control

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/directory"
)

// The messaging directory's side of the control stream
// (docs/messaging.md): sidecars join and leave group ranks; every change
// is pushed at once to the pods with members, and a stream's end (its pod
// died) removes its pod's members, which the others hear about as soon as
// the operator sees the stream end.

// groupJoin handles a sidecar's join: the group is of the stream's own
// (verified) namespace, the member is the stream's pod.
func (s *Server) groupJoin(c *conn, j *controlv1.GroupJoin) {
	k := directory.Key{Namespace: c.id.Namespace, Session: j.Session, Group: j.Group}
	res := &controlv1.GroupJoinResult{JoinId: j.JoinId}
	var u *directory.Update
	var err error
	if s.scope != nil && j.Session != "" {
		if ns, ok := s.scope.SessionNamespace(j.Session); ok && ns != c.id.Namespace {
			rejected(ReasonForeignSession)
			err = fmt.Errorf("%w: session %q is of another namespace", errForeignGroup, j.Session)
		}
	}
	if err == nil {
		u, err = s.groups().Join(k, j.Size, j.Mailbox, directory.Member{Rank: j.Rank, Stream: c.sid,
			Addr: c.id.DataplaneAddr, Pod: c.id.Pod, Node: c.id.Node})
	}
	if err != nil {
		res.Error = err.Error()
		switch {
		case errors.Is(err, directory.ErrConflict):
			res.Code = int32(codes.AlreadyExists)
		case errors.Is(err, errForeignGroup):
			res.Code = int32(codes.PermissionDenied)
		default:
			res.Code = int32(codes.InvalidArgument)
		}
	}
	// The result first, then the view: the joining sidecar waits for the
	// result and finds itself in the view that follows.
	s.sendTo(c, &controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_GroupJoinResult{GroupJoinResult: res}})
	if u != nil {
		s.push(*u)
	}
}

var errForeignGroup = errors.New("group of another namespace")

func (s *Server) groupLeave(c *conn, l *controlv1.GroupLeave) {
	k := directory.Key{Namespace: c.id.Namespace, Session: l.Session, Group: l.Group}
	if u := s.groups().Leave(k, l.Rank, c.sid); u != nil {
		s.push(*u)
	}
}

// DefaultStreamGrace is how long the directory waits for a pod whose
// stream ended to reconnect before it announces the pod's members gone.
const DefaultStreamGrace = 400 * time.Millisecond

// streamEnded announces that the stream's pod's members are gone, unless
// the pod reconnects and joins them again within the grace (a live pod
// whose stream broke must not look dead to its groups).
//
// The directory is read through groups(), like every other use: a stream
// ending while another stream's first join makes the directory read
// s.Groups unsynchronized otherwise (a data race the e2e suite's race
// detector reported).
func (s *Server) streamEnded(c *conn) {
	g := s.groups()
	g.StreamEnded(c.sid)
	grace := s.StreamGrace
	if grace <= 0 {
		grace = DefaultStreamGrace
	}
	time.AfterFunc(grace, func() {
		for _, u := range g.Expire(c.sid) {
			s.push(u)
		}
	})
}

func (s *Server) groups() *directory.Directory {
	s.groupsOnce.Do(func() {
		if s.Groups == nil {
			s.Groups = directory.New()
		}
	})
	return s.Groups
}

// push sends a view to the streams of its update.
func (s *Server) push(u directory.Update) {
	v := &controlv1.GroupView{Session: u.View.Session, Group: u.View.Group, Size: u.View.Size, Mailbox: u.View.Mailbox,
		Epoch: u.View.Epoch, Gone: u.View.Gone}
	msg := &controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_GroupView{GroupView: v}}
	groupViews.Add(float64(len(u.Streams)))
	s.mu.RLock()
	// The pod UID is the member's stream's, from its verified token (a
	// member whose stream ended and waits for its pod to reconnect has
	// none: same-node peers then use the sidecars' path to it).
	for _, m := range u.View.Members {
		gm := &controlv1.GroupMember{Rank: m.Rank, DataplaneAddr: m.Addr, Pod: m.Pod, Node: m.Node}
		if c := s.bySID[m.Stream]; c != nil {
			gm.PodUid = c.id.PodUID
		}
		v.Members = append(v.Members, gm)
	}
	targets := make([]*conn, 0, len(u.Streams))
	for _, id := range u.Streams {
		if c := s.bySID[id]; c != nil {
			targets = append(targets, c)
		}
	}
	s.mu.RUnlock()
	for _, c := range targets {
		s.sendTo(c, msg)
	}
}

// sendTo queues m for one stream without blocking the caller: a sidecar
// whose queue is full is disconnected (it reconnects and joins again).
func (s *Server) sendTo(c *conn, m *controlv1.OperatorMessage) {
	select {
	case c.out <- m:
	case <-c.gone:
	default:
		c.close()
	}
}

// ServerOptions are the gRPC options of the control stream's server:
// HTTP/2 pings on a stream idle for a second, and a stream whose sidecar
// does not answer one within two is closed. A pod that vanished without
// closing its connection (its node or network gone) is thus noticed
// within about three seconds; one whose process died closes its
// connection and is noticed at once (docs/messaging.md). Tighter bounds
// took live sidecars on a busy node for dead.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Second, Timeout: 2 * time.Second})}
}
