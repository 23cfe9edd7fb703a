package localapi

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
)

// The messaging fast path (docs/messaging.md, "The function's socket"):
// Send and Recv on a second unix socket, MessageSocket, with a minimal
// binary framing instead of gRPC, because a small message's latency is
// mostly the cost of the calls around it. One request at a time per
// connection; clients keep a pool of connections.
//
//	request:  u32 n, u8 op (1 send, 2 recv), u8 flags, u16 session length,
//	          u16 group length, u16 0, u32 rank, u32 peer, i64 tag,
//	          i64 timeout ms, session, group, payload (send: the bytes, or
//	          with flags bit 0 the path of a file of the object directory)
//	response: u32 n, u8 status (0 ok, 1 error), u8 flags, u16 reason
//	          length, u32 from, i64 tag, u64 size, reason, payload (recv: the
//	          bytes, or with flags bit 0 a file's path; error: the message)
//
// All integers are little endian. Recv flags: bit 0 any source, bit 1 any
// tag. Send response flags: bit 1 mailboxed.

// MessageSocket is the fast path's socket, named after the local API's
// (sidecar.sock: sidecar.msg.sock), so sidecars whose API sockets share a
// directory do not share it.
func MessageSocket(apiSocket string) string {
	return strings.TrimSuffix(apiSocket, ".sock") + ".msg.sock"
}

const (
	opSend = 1
	opRecv = 2

	reqFixed  = 32
	respFixed = 24
	// maxNames bounds a request's session and group.
	maxNames = 1 << 10
	// maxInlineSend bounds a send's inline bytes (larger: a file).
	maxInlineSend = 64 << 20
)

var errMsgFrame = errors.New("malformed messaging frame")

// ServeMessages answers the fast path on ln until it closes.
func (s *Server) ServeMessages(ln net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Go(func() { s.serveMessageConn(c) })
	}
}

type msgRequest struct {
	op, flags      uint8
	session, group string
	rank, peer     uint32
	tag, timeoutMs int64
	payload        []byte
}

func readMsgRequest(r *bufio.Reader) (*msgRequest, error) {
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return nil, err
	}
	n := int64(binary.LittleEndian.Uint32(lb[:]))
	if n < reqFixed || n > reqFixed+2*maxNames+maxInlineSend {
		return nil, fmt.Errorf("%w: request of %d bytes", errMsgFrame, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	sl, gl := int(binary.LittleEndian.Uint16(b[2:])), int(binary.LittleEndian.Uint16(b[4:]))
	if sl > maxNames || gl > maxNames || int64(reqFixed+sl+gl) > n {
		return nil, fmt.Errorf("%w: names of %d and %d bytes", errMsgFrame, sl, gl)
	}
	q := &msgRequest{op: b[0], flags: b[1], rank: binary.LittleEndian.Uint32(b[8:]), peer: binary.LittleEndian.Uint32(b[12:]),
		tag: int64(binary.LittleEndian.Uint64(b[16:])), timeoutMs: int64(binary.LittleEndian.Uint64(b[24:]))}
	q.session = string(b[reqFixed : reqFixed+sl])
	q.group = string(b[reqFixed+sl : reqFixed+sl+gl])
	q.payload = b[reqFixed+sl+gl:]
	return q, nil
}

type msgResponse struct {
	flags  uint8
	from   uint32
	tag    int64
	size   uint64
	reason string
	body   []byte
	err    bool
}

func writeMsgResponse(w *bufio.Writer, p *msgResponse) error {
	var h [4 + respFixed]byte
	binary.LittleEndian.PutUint32(h[:], uint32(respFixed+len(p.reason)+len(p.body)))
	if p.err {
		h[4] = 1
	}
	h[5] = p.flags
	binary.LittleEndian.PutUint16(h[6:], uint16(len(p.reason)))
	binary.LittleEndian.PutUint32(h[8:], p.from)
	binary.LittleEndian.PutUint64(h[12:], uint64(p.tag))
	binary.LittleEndian.PutUint64(h[20:], p.size)
	_, _ = w.Write(h[:])
	_, _ = w.WriteString(p.reason)
	_, _ = w.Write(p.body)
	return w.Flush()
}

func errorResponse(err error) *msgResponse {
	reason := ReasonOf(err)
	switch {
	case reason != "":
	case errors.Is(err, context.DeadlineExceeded):
		reason = ReasonMsgTimeout
	case errors.Is(err, context.Canceled):
		reason = "CANCELED"
	default:
		reason = "INTERNAL"
	}
	return &msgResponse{err: true, reason: reason, body: []byte(err.Error())}
}

func (s *Server) serveMessageConn(c net.Conn) {
	defer c.Close()
	r, w := bufio.NewReaderSize(c, 64<<10), bufio.NewWriterSize(c, 64<<10)
	for {
		q, err := readMsgRequest(r)
		if err != nil {
			if errors.Is(err, errMsgFrame) {
				_ = writeMsgResponse(w, errorResponse(fmt.Errorf("%w: %v", ErrBadPayload, err)))
			}
			return
		}
		resp := s.whileConnected(c, r, q)
		if writeMsgResponse(w, resp) != nil {
			if resp.flags&1 != 0 {
				_ = os.Remove(string(resp.body)) // nobody will map it
			}
			return
		}
	}
}

// whileConnected runs a request with a context that ends if the client
// goes away meanwhile (a receive waiting for a message must not take one
// for a caller that is gone; a send the caller gave up on, e.g. held back
// by a full receiver, must not go on without it): the client sends nothing
// while it waits, so a read that returns means it hung up (or broke the
// protocol).
func (s *Server) whileConnected(c net.Conn, r *bufio.Reader, q *msgRequest) *msgResponse {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if _, err := r.Peek(1); !errors.Is(err, os.ErrDeadlineExceeded) {
			cancel()
		}
	}()
	resp := s.message(ctx, q)
	_ = c.SetReadDeadline(time.Now())
	<-watched
	_ = c.SetReadDeadline(time.Time{})
	if ctx.Err() != nil && resp.err {
		resp.reason = "CANCELED"
	}
	return resp
}

// message runs one fast-path request.
func (s *Server) message(ctx context.Context, q *msgRequest) *msgResponse {
	rt, err := s.router()
	if err != nil {
		return errorResponse(err)
	}
	if q.timeoutMs > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(q.timeoutMs)*time.Millisecond)
		defer cancel()
	}
	switch q.op {
	case opSend:
		p := inlinePayload(q.payload)
		if q.flags&1 != 0 {
			p = pathPayload(string(q.payload))
		}
		out := messaging.Outgoing{Session: q.session, Group: q.group, From: q.rank, To: q.peer, Tag: q.tag}
		mailboxed, err := s.send(ctx, rt, out, p)
		if err != nil {
			return errorResponse(err)
		}
		resp := &msgResponse{}
		if mailboxed {
			resp.flags |= 2
		}
		return resp
	case opRecv:
		m, err := rt.Recv(ctx, q.session, q.group, q.rank, messaging.Filter{AnySource: q.flags&1 != 0, From: q.peer, AnyTag: q.flags&2 != 0, Tag: q.tag})
		if err != nil {
			return errorResponse(err)
		}
		resp := &msgResponse{from: m.From, tag: m.Tag, size: m.Size, body: m.Data}
		if m.Path != "" {
			resp.flags |= 1
			resp.body = []byte(m.Path)
		}
		return resp
	default:
		return errorResponse(fmt.Errorf("%w: unknown operation %d", ErrBadPayload, q.op))
	}
}
