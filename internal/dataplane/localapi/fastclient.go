package localapi

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
)

// MessageClient speaks the messaging fast path (fastmsg.go) to a sidecar's
// MessageSocket, with a pool of connections (one request at a time each).
type MessageClient struct {
	socket string
	// LendFiles: member channels ask the sidecar to lend the files of
	// large messages (Received.Token), which the caller then releases
	// (MemberChannel.Release) instead of removing (msgfiles.go).
	LendFiles bool
	// TCPChannels: member channels and opens take direct channels across
	// nodes, TCP sockets (the client reads them with directmsg.NewConn).
	TCPChannels bool
	mu          sync.Mutex
	free        []*msgConn
	closed      bool
}

type msgConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

// NewMessageClient returns a client for the socket (connections are made
// as needed).
func NewMessageClient(socket string) *MessageClient { return &MessageClient{socket: socket} }

// MessageError is a fast-path error: Reason is one of the Reason
// constants (the gRPC calls' classes).
type MessageError struct {
	Reason, Message string
}

func (e *MessageError) Error() string { return e.Message }

// Received is a message a Recv returned: Data when small, else Path, a
// file of the object directory the caller owns (map, then remove).
type Received struct {
	From uint32
	Tag  int64
	Size uint64
	Data []byte
	Path string
	// Token, with Path, says the file is lent: the caller maps it without
	// removing it and releases the token when done (MemberChannel.Release).
	Token string
}

func (c *MessageClient) get() (*msgConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("message client closed")
	}
	if n := len(c.free); n > 0 {
		mc := c.free[n-1]
		c.free = c.free[:n-1]
		c.mu.Unlock()
		return mc, nil
	}
	c.mu.Unlock()
	nc, err := net.Dial("unix", c.socket)
	if err != nil {
		return nil, err
	}
	raw := messaging.Raw(nc) // no wake-up of the runtime's monitor thread per call
	return &msgConn{c: nc, r: bufio.NewReaderSize(raw, 64<<10), w: bufio.NewWriterSize(raw, 64<<10)}, nil
}

func (c *MessageClient) put(mc *msgConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.free) >= 64 {
		mc.c.Close()
		return
	}
	c.free = append(c.free, mc)
}

// Close closes the idle connections.
func (c *MessageClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, mc := range c.free {
		mc.c.Close()
	}
	c.free = nil
	return nil
}

// Send sends data (or, with path set, the object directory's file at
// path, which the sidecar takes over) to rank to.
func (c *MessageClient) Send(ctx context.Context, session, group string, from, to uint32, tag int64, data []byte, path string) (mailboxed bool, err error) {
	var flags uint8
	if path != "" {
		flags, data = 1, []byte(path)
	}
	resp, err := c.call(ctx, opSend, flags, session, group, from, to, tag, data)
	if err != nil {
		return false, err
	}
	return resp.flags&2 != 0, nil
}

// SendFile sends the object directory's file at path and asks for it
// back once it was sent (returned: the caller may write its next message
// into it; otherwise the sidecar removed it, as after a failed send).
func (c *MessageClient) SendFile(ctx context.Context, session, group string, from, to uint32, tag int64, path string) (mailboxed, returned bool, err error) {
	resp, err := c.call(ctx, opSend, 1|flagReturnFile, session, group, from, to, tag, []byte(path))
	if err != nil {
		return false, false, err
	}
	return resp.flags&2 != 0, resp.flags&flagReturned != 0, nil
}

// Recv receives the oldest matching message for rank.
func (c *MessageClient) Recv(ctx context.Context, session, group string, rank uint32, anySource bool, from uint32, anyTag bool, tag int64) (*Received, error) {
	var flags uint8
	if anySource {
		flags |= 1
	}
	if anyTag {
		flags |= 2
	}
	resp, err := c.call(ctx, opRecv, flags, session, group, rank, from, tag, nil)
	if err != nil {
		return nil, err
	}
	out := &Received{From: resp.from, Tag: resp.tag, Size: resp.size}
	if resp.flags&1 != 0 {
		out.Path = string(resp.body)
	} else {
		out.Data = resp.body
	}
	return out, nil
}

func (c *MessageClient) call(ctx context.Context, op, flags uint8, session, group string, rank, peer uint32, tag int64, payload []byte) (*msgResponse, error) {
	if len(session) > maxNames || len(group) > maxNames {
		return nil, &MessageError{Reason: ReasonMsgInvalid, Message: "session and group names are at most 1 KiB"}
	}
	var timeoutMs int64
	if d, ok := ctx.Deadline(); ok {
		if timeoutMs = time.Until(d).Milliseconds(); timeoutMs <= 0 {
			return nil, &MessageError{Reason: ReasonMsgTimeout, Message: "deadline passed before the call: " + context.Cause(ctx).Error()}
		}
	}
	mc, err := c.get()
	if err != nil {
		return nil, &MessageError{Reason: "UNAVAILABLE", Message: "messaging socket: " + err.Error()}
	}
	// A context that ends without a deadline (cancel) ends the call:
	// the connection is dropped, which tells the sidecar.
	stop := context.AfterFunc(ctx, func() { _ = mc.c.SetDeadline(time.Now()) })
	var h [4 + reqFixed]byte
	_, _ = mc.w.Write(appendMsgRequest(h[:0], op, flags, session, group, rank, peer, tag, timeoutMs, len(payload)))
	_, _ = mc.w.WriteString(session)
	_, _ = mc.w.WriteString(group)
	_, _ = mc.w.Write(payload)
	err = mc.w.Flush()
	var resp *msgResponse
	if err == nil {
		resp, err = readMsgResponse(mc.r)
	}
	if !stop() || err != nil {
		mc.c.Close()
		if ctx.Err() != nil {
			return nil, &MessageError{Reason: ReasonMsgTimeout, Message: "call ended: " + context.Cause(ctx).Error()}
		}
		if err != nil {
			return nil, &MessageError{Reason: "UNAVAILABLE", Message: "messaging socket: " + err.Error()}
		}
	} else {
		c.put(mc)
	}
	if resp.err {
		return nil, &MessageError{Reason: resp.reason, Message: string(resp.body)}
	}
	return resp, nil
}

// appendMsgRequest appends a request's fixed part (the names and n bytes
// of payload follow).
func appendMsgRequest(b []byte, op, flags uint8, session, group string, rank, peer uint32, tag, timeoutMs int64, n int) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(reqFixed+len(session)+len(group)+n))
	b = append(b, op, flags)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(session)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(group)))
	b = append(b, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, rank)
	b = binary.LittleEndian.AppendUint32(b, peer)
	b = binary.LittleEndian.AppendUint64(b, uint64(tag))
	return binary.LittleEndian.AppendUint64(b, uint64(timeoutMs))
}

func readMsgResponse(r *bufio.Reader) (*msgResponse, error) {
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return nil, err
	}
	n := int64(binary.LittleEndian.Uint32(lb[:]))
	if n < respFixed {
		return nil, fmt.Errorf("%w: response of %d bytes", errMsgFrame, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	rl := int64(binary.LittleEndian.Uint16(b[2:]))
	if respFixed+rl > n {
		return nil, fmt.Errorf("%w: reason of %d bytes", errMsgFrame, rl)
	}
	return &msgResponse{err: b[0] == 1, status: b[0], flags: b[1], from: binary.LittleEndian.Uint32(b[4:]), tag: int64(binary.LittleEndian.Uint64(b[8:])),
		size: binary.LittleEndian.Uint64(b[16:]), reason: string(b[respFixed : respFixed+rl]), body: b[respFixed+rl:]}, nil
}
