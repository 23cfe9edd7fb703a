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
	"github.com/ziptrail/ziptrail/internal/recovery"
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
// tag. Send flags: bit 0 the payload is a file's path, bit 1 give that
// file back once sent (msgfiles.go). Send response flags: bit 1
// mailboxed, bit 2 the file was given back.

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
		wg.Go(func() {
			defer recovery.Recover("queue-proxy-zl", "local messages conn")
			s.serveMessageConn(c)
		})
	}
}

type msgRequest struct {
	op, flags      uint8
	session, group string
	rank, peer     uint32
	tag, timeoutMs int64
	payload        []byte
	buf            []byte // the request's bytes (pooled: messaging.GetBuf)
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
	b := messaging.GetBuf(int(n))
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
	q.buf = b
	return q, nil
}

type msgResponse struct {
	status uint8 // with err false: 0, or a member channel's push kind
	flags  uint8
	from   uint32
	tag    int64
	size   uint64
	reason string
	body   []byte
	err    bool
	// pooled is a buffer to give back (messaging.PutBuf) once written.
	pooled []byte
	// undelivered, when set, is called instead of dropping the response
	// (and its file and buffer) when its client is gone: a received
	// message goes back to its member's inbox.
	undelivered func()
}

func writeMsgResponse(w *bufio.Writer, p *msgResponse) error {
	var h [4 + respFixed]byte
	_, _ = w.Write(appendMsgHeader(h[:0], p))
	_, _ = w.WriteString(p.reason)
	_, _ = w.Write(p.body)
	return w.Flush()
}

// appendMsgHeader appends a response's fixed part.
func appendMsgHeader(b []byte, p *msgResponse) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(respFixed+len(p.reason)+len(p.body)))
	st := p.status
	if p.err {
		st = 1
	}
	b = append(b, st, p.flags)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(p.reason)))
	b = binary.LittleEndian.AppendUint32(b, p.from)
	b = binary.LittleEndian.AppendUint64(b, uint64(p.tag))
	return binary.LittleEndian.AppendUint64(b, p.size)
}

// appendMsgResponse appends a whole response.
func appendMsgResponse(b []byte, p *msgResponse) []byte {
	return append(append(appendMsgHeader(b, p), p.reason...), p.body...)
}

// sendResponse answers a send: an error, or flags bit 1 mailboxed and
// bit 2 the file given back.
func sendResponse(mailboxed, returned bool, err error) *msgResponse {
	if err != nil {
		return errorResponse(err)
	}
	resp := &msgResponse{}
	if mailboxed {
		resp.flags |= 2
	}
	if returned {
		resp.flags |= flagReturned
	}
	return resp
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

// serveMessageConn answers one connection's requests, one at a time. A
// request that cannot be answered at once (a receive waiting for its
// message, a send waiting for the receiver's sidecar) does not hold this
// goroutine: the goroutine that ends it (the stream reader that queued the
// message or got the answer) writes the response, and this one goes back
// to reading the connection. That read is also the watch over the waiting
// request: the client sends nothing while it waits, so a read that
// returns means it hung up (or broke the protocol), and the request is
// given up (a receive must not take a message for a caller that is gone;
// a send the caller gave up on, e.g. held back by a full receiver, must
// not go on without it).
func (s *Server) serveMessageConn(c net.Conn) {
	defer c.Close()
	// Responses are written by whichever goroutine ends a request, the
	// message stream's reader among them: a response (at most an inline
	// message, 64 KiB and a header) must fit in the socket's buffer, so
	// that the reader does not wait for a function slow to read it. (A
	// function that never reads its responses yet sends more requests
	// fills it at last, and holds up its own pod's messages from that
	// peer.)
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.SetWriteBuffer(256 << 10)
	}
	raw := messaging.Raw(c)
	r, w := bufio.NewReaderSize(raw, 64<<10), bufio.NewWriterSize(raw, 64<<10)
	var cur *msgCall
	for {
		_, err := r.Peek(1)
		if cur != nil && !cur.settled() {
			cur.giveUp()
			return
		}
		if err != nil {
			return
		}
		q, err := readMsgRequest(r)
		if err != nil {
			if errors.Is(err, errMsgFrame) {
				_ = writeMsgResponse(w, errorResponse(fmt.Errorf("%w: %v", ErrBadPayload, err)))
			}
			return
		}
		switch q.op {
		case opAttach:
			s.serveAttach(c, r, w, q) // the connection is the member's now
			return
		case opOpen:
			if s.answerOpen(c, w, q) != nil {
				return
			}
			cur = nil
			continue
		}
		cur = &msgCall{w: w, req: q.buf}
		cur.setCancel(s.startMessage(q, cur.respond))
	}
}

// msgCall is one request of a connection until its response is written.
type msgCall struct {
	w   *bufio.Writer
	req []byte // the request's buffer (pooled), under mu
	// mu is held while the response is written: settled waits for it.
	mu       sync.Mutex
	answered bool
	cancel   func()
}

// respond writes the call's response, once: a response for a client that
// gave up (or a second one) is dropped, with its file.
//
// The request is over when its response comes, so its buffer goes back
// to the pool, with the message's.
func (m *msgCall) respond(resp *msgResponse) {
	m.mu.Lock()
	delivered := !m.answered && writeMsgResponse(m.w, resp) == nil
	m.answered = true
	messaging.PutBuf(m.req)
	m.req = nil
	m.mu.Unlock()
	switch {
	case delivered:
		messaging.PutBuf(resp.pooled)
	case resp.undelivered != nil:
		resp.undelivered() // the body and its file are the message's again
	default:
		if resp.flags&1 != 0 {
			_ = os.Remove(string(resp.body)) // nobody will map it
		}
		messaging.PutBuf(resp.pooled)
	}
}

// settled reports whether the response was written (waiting for a write
// under way).
func (m *msgCall) settled() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.answered
}

func (m *msgCall) setCancel(c func()) {
	m.mu.Lock()
	m.cancel = c
	m.mu.Unlock()
}

// giveUp ends a request whose client is gone: its response, if any still
// comes, is dropped.
func (m *msgCall) giveUp() {
	m.mu.Lock()
	m.answered = true
	c := m.cancel
	m.mu.Unlock()
	if c != nil {
		c()
	}
}

// startMessage starts one fast-path request; respond gets its response,
// from this goroutine or another. It returns the request's cancel.
func (s *Server) startMessage(q *msgRequest, respond func(*msgResponse)) func() {
	rt, err := s.router()
	if err != nil {
		respond(errorResponse(err))
		return nil
	}
	var timeout time.Duration
	if q.timeoutMs > 0 {
		timeout = time.Duration(q.timeoutMs) * time.Millisecond
	}
	switch q.op {
	case opSend:
		out := messaging.Outgoing{Session: q.session, Group: q.group, From: q.rank, To: q.peer, Tag: q.tag}
		sent := func(mailboxed bool, err error) { respond(sendResponse(mailboxed, false, err)) }
		if q.flags&1 != 0 {
			// A file of the object directory: opened, sent and removed on
			// a goroutine of its own.
			ctx, cancel := context.WithCancel(context.Background())
			if timeout > 0 {
				ctx, cancel = context.WithTimeout(context.Background(), timeout)
			}
			giveBack := q.flags&flagReturnFile != 0
			go func() {
				defer recovery.Recover("queue-proxy-zl", "local messages send file")
				defer cancel()
				respond(sendResponse(s.sendFile(ctx, rt, out, string(q.payload), giveBack)))
			}()
			return cancel
		}
		out.Data = q.payload
		if out.Data == nil {
			out.Data = []byte{}
		}
		return rt.SendFunc(out, timeout, sent)
	case opRecv:
		f := messaging.Filter{AnySource: q.flags&1 != 0, From: q.peer, AnyTag: q.flags&2 != 0, Tag: q.tag}
		return rt.RecvFunc(q.session, q.group, q.rank, f, timeout, func(m messaging.Message, err error) {
			if err != nil {
				respond(errorResponse(err))
				return
			}
			resp := &msgResponse{from: m.From, tag: m.Tag, size: m.Size, body: m.Data, pooled: m.Data}
			if m.Path != "" {
				m.HandOut(false)
				resp.flags |= 1
				resp.body = []byte(m.Path)
			}
			// A client that gave up after the message was taken for it
			// (before its hang-up was seen): the message is not lost.
			resp.undelivered = func() { rt.Unreceive(q.session, q.group, q.rank, m) }
			respond(resp)
		})
	default:
		respond(errorResponse(fmt.Errorf("%w: unknown operation %d", ErrBadPayload, q.op)))
		return nil
	}
}
