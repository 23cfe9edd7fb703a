package control

import (
	"context"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/tap"

	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
)

// DefaultLimits are the control service's limits where Server.Limits
// leaves them zero:
//   - 4096 connections (one per sidecar pod, plus activator-ext's), of
//     which 256 may have authenticated no call yet (and for at most 10 s:
//     enough for every sidecar of a node reconnecting at once after an
//     operator restart, each refused one retrying); the HTTP/2 handshake
//     within 5 s;
//   - a token verified within 2 s (TokenReview, cached by TokenReviewer):
//     the review runs on the connection's reader (guard's tap), and the
//     keepalive (ServerOptions) closes a connection read nothing from
//     for 3 s, so a longer review would end the connection instead of
//     refusing the call with Unavailable;
//   - 100 calls at once per connection, headers up to 64 KiB;
//   - messages up to 4 MiB (gRPC's default, which the sidecars have always
//     been held to: an ObjectReady carries at most the inline threshold's
//     bytes);
//   - a call's first message (GetKeys' request, a stream's Hello) whole
//     within 10 s of the call's start; a stream's later messages are not
//     timed, since a sidecar's stream is idle between events;
//   - client pings at most every 10 s;
//   - a call's flow-control window 256 KiB, and a connection refused
//     more than 10 calls a second left unread until it is back under
//     (guard.Limits.Window, RefusalsPerSecond).
var DefaultLimits = guard.Limits{
	MaxConns: 4096, MaxUnauthConns: 256, AuthTimeout: 10 * time.Second,
	HandshakeTimeout: 5 * time.Second, ReviewTimeout: 2 * time.Second,
	MaxStreams: 100, MaxRecvMsgSize: 4 << 20, MaxHeaderBytes: 64 << 10,
	RecvTimeout: 10 * time.Second, MinPingInterval: 10 * time.Second,
	Window: 256 << 10, RefusalsPerSecond: 10,
}

func (s *Server) guardian() *guard.Guard {
	s.guardOnce.Do(func() { s.guard = guard.New("control", s.Limits.Or(DefaultLimits), s.tapAuthenticate) })
	return s.guard
}

// ServerOptions are the gRPC options of this server: the package's
// ServerOptions (keepalive), and its guard: every call authenticated
// before its message is read, connections, streams, message sizes and
// receive times bounded by Limits. Serve it on its Listener.
func (s *Server) ServerOptions() []grpc.ServerOption {
	return append(ServerOptions(), s.guardian().ServerOptions()...)
}

// Listener wraps the server's listener: connections capped, and those
// that authenticate no call closed (Limits). Serve the server with it.
func (s *Server) Listener(ln net.Listener) net.Listener { return s.guardian().Listener(ln) }

// tapCaller is who the tap found a call's token to be.
type tapCaller struct {
	token  string
	caller Caller
}

// tapAuthenticate runs in the server's tap, before the call exists or its
// message is read: a call without a valid token is refused (and counted,
// ziptrail_control_rejections_total) without the server taking in its
// message; the caller found travels in the call's context (caller).
func (s *Server) tapAuthenticate(ctx context.Context, _ *tap.Info) (any, error) {
	c, err := s.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	return tapCaller{token: bearerToken(ctx), caller: c}, nil
}

// caller is the verified caller of a call: the one the tap found, else
// (a server not served with ServerOptions) its token verified now.
func (s *Server) caller(ctx context.Context) (Caller, error) {
	if c, ok := guard.IdentityOf[tapCaller](ctx); ok && c.token != "" && c.token == bearerToken(ctx) {
		return c.caller, nil
	}
	return s.authenticate(ctx)
}
