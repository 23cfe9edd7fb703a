package pull

import (
	"errors"
	"io"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"

	dp "github.com/ziptrail/ziptrail/internal/dataplane/capnp"
)

// errSelfPipelined: see guardedTransport.
var errSelfPipelined = errors.New("data plane: call pipelined on its own answer (refused)")

// guardedTransport screens incoming messages before capnp-go's rpc package
// sees them. v3.1.0-alpha.2 (pinned) registers a call's answer before it
// resolves the call's target, so a call whose target is a promise on its
// own question id dereferences a nil pipeline caller and panics in a
// goroutine nobody can recover: one crafted frame would kill the sidecar.
// FuzzProducerFrames found it. The connection is dropped instead.
type guardedTransport struct{ transport.Transport }

func (g guardedTransport) RecvMessage() (transport.IncomingMessage, error) {
	in, err := g.Transport.RecvMessage()
	if err != nil {
		return nil, err
	}
	if selfPipelined(in.Message()) {
		in.Release()
		return nil, errSelfPipelined
	}
	return in, nil
}

func selfPipelined(m rpccp.Message) bool {
	if m.Which() != rpccp.Message_Which_call {
		return false
	}
	call, err := m.Call()
	if err != nil {
		return false // the rpc package reports unreadable calls itself
	}
	tgt, err := call.Target()
	if err != nil || tgt.Which() != rpccp.MessageTarget_Which_promisedAnswer {
		return false
	}
	pa, err := tgt.PromisedAnswer()
	return err == nil && pa.QuestionId() == call.QuestionId()
}

// newConn serves the producer interface on one consumer connection.
func (s *Server) newConn(rwc io.ReadWriteCloser) *rpc.Conn {
	boot := capnp.Client(dp.Producer_ServerToClient(&producer{s}))
	return rpc.NewConn(guardedTransport{rpc.NewStreamTransport(rwc)}, &rpc.Options{BootstrapClient: boot})
}
