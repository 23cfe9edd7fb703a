// Package directmsg is the same-node direct channel between two group
// members' functions (docs/messaging.md, "Same-node direct channels"):
// the framing of one direction s -> r over a SOCK_SEQPACKET socketpair
// their sidecars made (channel.go), and the per-pod node messaging socket
// over which a sender's sidecar asks the receiver's for one (node.go).
//
// # Framing
//
// Every frame is one SOCK_SEQPACKET message, so a descriptor travels with
// exactly its frame:
//
//	u32 magic/version "ZTD1", u8 kind (1 inline, 2 memfd, 4 copy),
//	i64 tag, u64 size, then for inline the size bytes
//
// little endian. A message of up to InlineMax bytes is one inline frame.
// A larger one of up to CopyMax bytes goes in a memfd the sender reuses
// (kind 4, the descriptor attached to a frame without bytes): the
// receiver copies the size bytes out and credits the sender, who then
// writes its next message into the same pages. A fresh memfd's page
// allocation costs more than the two copies at these sizes
// (docs/bench/history/messaging.md, "Same-node direct channels, first
// run"), and the receiver's
// copy is what makes a memfd its sender may still write safe: what it
// holds is what it copied. Both ends keep their mappings of a reused
// memfd (copies.go): the sender writes into its mapping, the receiver
// copies out of its own when the memfd is sealed against shrinking (a
// mapping then cannot fault past the file's end), else with pread. A message larger than CopyMax goes as one memfd sealed with
// samenode.RequiredSeals (kind 2); the receiver checks the seals and the
// size (samenode.MapSealed) and maps it read-only: no copy into the
// receiving function.
//
// The receiver answers each memfd frame (kinds 2 and 4) with a credit
// frame (kind 3, its size), in order, so that a sender holds at most
// MaxInflight memfd bytes the receiver has not read, and knows when a
// reused memfd is free again.
//
// The peer is not trusted: a frame that is truncated, oversized, of an
// unknown kind, announces a size it does not carry, has descriptors it
// should not have, or a memfd that is unsealed or of another size ends
// the channel with an error (every received descriptor closed); so does,
// at the sender, a credit that does not match its oldest memfd frame.
package directmsg

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

const (
	// Magic is "ZTD1", the frames' first four bytes.
	Magic = uint32('Z') | uint32('T')<<8 | uint32('D')<<16 | uint32('1')<<24
	// HeaderSize is a frame's fixed header.
	HeaderSize = 4 + 1 + 8 + 8
	// InlineMax is the largest message sent inside its frame: every
	// frame fits a socket buffer of the kernel's default size.
	InlineMax = 128 << 10
	// CopyMax is the largest message sent in a reused memfd (copied out
	// by the receiver); larger ones go as a sealed memfd, mapped.
	CopyMax = 4 << 20
	// MaxMessage bounds a memfd message (the sidecar path's cap).
	MaxMessage = 1 << 30
	// poolKeep is how many reusable memfds a sender keeps per channel
	// once credited (their pages stay allocated: at most poolKeep ×
	// CopyMax bytes of the sender's memory per channel).
	poolKeep = 2

	// MaxInflight bounds the memfd bytes a sender has in a channel that
	// the receiver has not read yet (the kernel counts a frame's bytes
	// against the socket buffer, not its memfd's).
	MaxInflight = 16 << 20

	kindInline = 1
	kindMemfd  = 2
	kindCredit = 3 // receiver -> sender: a memfd's bytes were read
	kindCopy   = 4
)

// ErrFrame is a peer's protocol violation.
var ErrFrame = errors.New("malformed direct-channel frame")

// Conn is one end of a direct channel.
type Conn struct {
	// Alloc, when set (before the first Recv), gives the buffer of a
	// received message of n bytes with tag, outside the inline frame
	// buffer: nil asks Recv to allocate it. Messages in such a buffer
	// are Recycled.
	Alloc func(tag int64, n int) []byte

	c        net.Conn
	raw      syscall.RawConn // a socketpair end's (nil for a stream)
	stream   bool            // a TCP channel across nodes (stream.go)
	br       *bufio.Reader   // a stream's reader
	cbuf     []byte          // a stream sender's credit bytes read (under wmu)
	cmu      sync.Mutex      // a stream receiver's credits:
	owed     uint64          //   frame bytes read and not credited (under cmu)
	hold     func() bool     //   true while its inbox is over its cap
	idle     atomic.Bool     //   Recv waits for a frame, none of it read
	wmu      sync.Mutex
	inflight uint64    // memfd bytes sent and not credited (under wmu)
	unacked  []unacked // memfd frames not credited, oldest first (under wmu)
	pool     []*reused // reusable memfds credited back (under wmu)
	pooled   int       // reusable memfds made (tests)
	maps     mappings  // the receiver's mappings of the sender's reused memfds
	hdr      []byte    // the receiver's header buffer
	fd       int       // the descriptor of the memfd frame just read
	buf      []byte    // the receiver's frame buffer
	oob      []byte
}

// NewConn takes over f, a socketpair end (a same-node channel) or a
// connected TCP socket (a channel across nodes, stream.go).
func NewConn(f *os.File) (*Conn, error) {
	nc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		return &Conn{c: tc, stream: true}, nil
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: neither a unix nor a TCP socket", ErrFrame)
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		_ = uc.Close()
		return nil, err
	}
	return &Conn{c: uc, raw: rc}, nil
}

// unacked is a memfd frame the receiver has not credited yet.
type unacked struct {
	size uint64
	r    *reused // the reusable memfd it went in; nil: a sealed one
}

// Close closes the channel's end (a send waiting on it fails) and the
// sender's memfds.
func (c *Conn) Close() error {
	err := c.c.Close()
	c.maps.close()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for _, u := range c.unacked {
		if u.r != nil {
			u.r.close()
		}
	}
	for _, r := range c.pool {
		r.close()
	}
	c.unacked, c.pool = nil, nil
	return err
}

func header(kind byte, tag int64, size uint64) []byte {
	h := make([]byte, HeaderSize)
	binary.LittleEndian.PutUint32(h, Magic)
	h[4] = kind
	binary.LittleEndian.PutUint64(h[5:], uint64(tag))
	binary.LittleEndian.PutUint64(h[13:], size)
	return h
}

// Send writes one message, waiting while the receiver's socket is full
// (back-pressure), until ctx's deadline.
func (c *Conn) Send(ctx context.Context, tag int64, data []byte) (err error) {
	defer c.recoverFrame(&err) // the receiver's credits are a peer's bytes
	if len(data) > MaxMessage {
		return fmt.Errorf("message of %d bytes: at most %d", len(data), MaxMessage)
	}
	if c.stream {
		return c.sendStream(ctx, tag, data)
	}
	if len(data) <= InlineMax {
		c.wmu.Lock()
		defer c.wmu.Unlock()
		defer c.deadline(ctx)()
		return c.sendFrame(ctx, [][]byte{header(kindInline, tag, uint64(len(data))), data}, nil)
	}
	var sealed *os.File
	if len(data) > CopyMax {
		// Made before taking the channel: the copy does not hold it.
		var err error
		if sealed, err = samenode.NewSealed("msg", data); err != nil {
			return err
		}
		defer sealed.Close()
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	defer c.deadline(ctx)()
	size := uint64(len(data))
	// Credits already there free reusable memfds; then back-pressure:
	// wait for credits while the receiver has too much unread.
	if err := c.credits(false); err != nil {
		return ctxErr(ctx, err)
	}
	for c.inflight > 0 && c.inflight+size > MaxInflight {
		if err := c.credits(true); err != nil {
			return ctxErr(ctx, err)
		}
	}
	u := unacked{size: size}
	kind, f := byte(kindMemfd), sealed
	if sealed == nil {
		var err error
		if u.r, err = c.reusable(data); err != nil {
			return err
		}
		kind, f = kindCopy, u.r.f
	}
	if err := c.sendFrame(ctx, [][]byte{header(kind, tag, size)}, unix.UnixRights(int(f.Fd()))); err != nil {
		if u.r != nil {
			c.pool = append(c.pool, u.r) // not sent: free
		}
		return err
	}
	c.inflight += size
	c.unacked = append(c.unacked, u)
	return nil
}

// reusable returns a free reusable memfd holding data at offset 0 (under
// wmu): one credited back, or a new one.
func (c *Conn) reusable(data []byte) (*reused, error) {
	var r *reused
	if n := len(c.pool); n > 0 {
		r, c.pool = c.pool[n-1], c.pool[:n-1]
	} else {
		var err error
		if r, err = newReused(); err != nil {
			return nil, err
		}
		c.pooled++
	}
	if err := r.write(data); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// credits reads the receiver's credit frames (under wmu): those already
// there, or, with wait, at least one. Each must match the oldest memfd
// frame not credited; its reusable memfd is free again.
func (c *Conn) credits(wait bool) error {
	for {
		n, ok, err := c.credit(wait)
		if err != nil || !ok {
			return err
		}
		if len(c.unacked) == 0 || c.unacked[0].size != n {
			return fmt.Errorf("%w: a credit for %d bytes, %d memfd frames outstanding", ErrFrame, n, len(c.unacked))
		}
		u := c.unacked[0]
		c.unacked = c.unacked[1:]
		c.inflight -= n
		if u.r != nil {
			if len(c.pool) < poolKeep {
				c.pool = append(c.pool, u.r)
			} else {
				u.r.close()
			}
		}
		wait = false
	}
}

// deadline applies ctx's deadline to the socket (under wmu); a cancel
// ends the wait too. The returned func must run before the call returns:
// no deadline of this call may outlive it.
func (c *Conn) deadline(ctx context.Context) func() {
	d, _ := ctx.Deadline()
	_ = c.c.SetDeadline(d)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { _ = c.c.SetDeadline(time.Now()); close(fired) })
	return func() {
		if !stop() {
			<-fired
		}
	}
}

// sendFrame writes one frame, waiting while the socket is full.
func (c *Conn) sendFrame(ctx context.Context, iov [][]byte, oob []byte) error {
	var serr error
	err := c.raw.Write(func(fd uintptr) bool {
		for {
			_, serr = unix.SendmsgBuffers(int(fd), iov, oob, nil, unix.MSG_NOSIGNAL)
			switch serr {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false
			}
			return true
		}
	})
	if err != nil {
		return ctxErr(ctx, err)
	}
	if serr != nil {
		return os.NewSyscallError("sendmsg", serr)
	}
	return nil
}

// ctxErr is ctx's error for a wait that ended at its deadline or cancel
// (the socket's deadline may pass a moment before ctx's).
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w: %v", context.DeadlineExceeded, err)
	}
	return err
}

// credit reads one credit frame from the receiver (under wmu); without
// wait, ok is false when none is there.
func (c *Conn) credit(wait bool) (size uint64, ok bool, _ error) {
	var h [HeaderSize + 1]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	var n, oobn int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), h[:], oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
			switch rerr {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return !wait
			}
			return true
		}
	})
	if err == nil && rerr == unix.EAGAIN {
		return 0, false, nil
	}
	if err == nil && rerr == nil {
		if fds := samenode.Rights(oob[:oobn]); len(fds) > 0 {
			samenode.CloseFDs(fds)
			return 0, false, fmt.Errorf("%w: descriptors with a credit", ErrFrame)
		}
	}
	switch {
	case err != nil:
		return 0, false, err
	case rerr != nil:
		return 0, false, os.NewSyscallError("recvmsg", rerr)
	case n == 0:
		return 0, false, os.NewSyscallError("recvmsg", unix.EPIPE)
	case n != HeaderSize || binary.LittleEndian.Uint32(h[:]) != Magic || h[4] != kindCredit:
		return 0, false, fmt.Errorf("%w: a bad credit frame", ErrFrame)
	}
	return binary.LittleEndian.Uint64(h[13:]), true, nil
}

// Message is a received message: Data, which for a memfd message is a
// read-only mapping (Mapped) to unmap with samenode.Unmap, and for one
// in a buffer Conn.Alloc gave is that buffer (Recycled).
type Message struct {
	Tag      int64
	Data     []byte
	Mapped   bool
	Recycled bool
}

// Recv reads the next message; io.EOF when the sender's end closed.
// Recv is not safe for concurrent use. A panic reading a frame (a peer's
// bytes the code did not expect) closes the channel: ErrFrame.
func (c *Conn) Recv() (m Message, err error) {
	defer c.recoverFrame(&err)
	if c.stream {
		return c.recvStream()
	}
	if c.buf == nil {
		c.hdr = make([]byte, HeaderSize)
		c.buf = make([]byte, InlineMax+1)
		c.oob = make([]byte, unix.CmsgSpace(4*4))
	}
	n, kind, tag, size, err := c.frame(c.buf, true)
	if err != nil {
		return Message{}, err
	}
	switch kind {
	case kindInline:
		if size != uint64(n) || n > InlineMax {
			return Message{}, fmt.Errorf("%w: inline frame of %d bytes announcing %d", ErrFrame, n, size)
		}
		data, recycled := c.alloc(tag, n)
		copy(data, c.buf[:n])
		return Message{Tag: tag, Data: data, Recycled: recycled}, nil
	case kindMemfd:
		return c.recvMemfd(tag, size)
	case kindCopy:
		return c.recvCopy(tag, size)
	default:
		return Message{}, fmt.Errorf("%w: kind %d", ErrFrame, kind)
	}
}

// frame reads one frame's header and body (into body); a memfd frame's
// descriptor is kept in c.fd when memfd allows one.
func (c *Conn) frame(body []byte, memfd bool) (n int, kind byte, tag int64, size uint64, err error) {
	var total, oobn, flags int
	var rerr error
	iov := [][]byte{c.hdr, body}
	err = c.raw.Read(func(fd uintptr) bool {
		for {
			total, oobn, flags, _, rerr = unix.RecvmsgBuffers(int(fd), iov, c.oob, unix.MSG_CMSG_CLOEXEC)
			switch rerr {
			case unix.EINTR:
				continue
			case unix.ECONNRESET:
				// The sender closed with credits it had not read.
				// Linux reports that once, before the frames still
				// queued (the pending error is taken first): they
				// follow, then the end (0 bytes). Not the end yet.
				continue
			case unix.EAGAIN:
				return false
			}
			return true
		}
	})
	var fds []int
	if err == nil && rerr == nil {
		fds = samenode.Rights(c.oob[:oobn])
	}
	defer func() { samenode.CloseFDs(fds) }() // those not taken over
	switch {
	case err != nil:
		return 0, 0, 0, 0, err
	case rerr != nil:
		return 0, 0, 0, 0, os.NewSyscallError("recvmsg", rerr)
	case total == 0 && len(fds) == 0:
		return 0, 0, 0, 0, io.EOF
	case flags&unix.MSG_TRUNC != 0:
		return 0, 0, 0, 0, fmt.Errorf("%w: a frame over %d bytes", ErrFrame, HeaderSize+len(body))
	case flags&unix.MSG_CTRUNC != 0:
		return 0, 0, 0, 0, fmt.Errorf("%w: too many descriptors", ErrFrame)
	case total < HeaderSize || binary.LittleEndian.Uint32(c.hdr) != Magic:
		return 0, 0, 0, 0, fmt.Errorf("%w: bad header (%d bytes)", ErrFrame, total)
	}
	kind, tag, size = c.hdr[4], int64(binary.LittleEndian.Uint64(c.hdr[5:])), binary.LittleEndian.Uint64(c.hdr[13:])
	switch {
	case (kind == kindMemfd || kind == kindCopy) && memfd:
		if len(fds) != 1 || total != HeaderSize {
			return 0, 0, 0, 0, fmt.Errorf("%w: memfd frame of %d bytes with %d descriptors", ErrFrame, total, len(fds))
		}
		c.fd, fds = fds[0], nil
	case len(fds) != 0:
		return 0, 0, 0, 0, fmt.Errorf("%w: %d descriptors with a frame of kind %d", ErrFrame, len(fds), kind)
	}
	return total - HeaderSize, kind, tag, size, nil
}

// recvCopy copies a reused memfd's message out (c.fd) and credits the
// sender, who may then write into it again: what the receiver holds is
// what it copied, whatever the sender does with its memfd afterwards.
func (c *Conn) recvCopy(tag int64, size uint64) (Message, error) {
	f := os.NewFile(uintptr(c.fd), "memfd")
	defer f.Close()
	if size <= InlineMax || size > CopyMax {
		return Message{}, fmt.Errorf("%w: a copied memfd message of %d bytes", ErrFrame, size)
	}
	data, recycled := c.alloc(tag, int(size))
	if err := c.maps.copyOut(f, data); err != nil {
		return Message{}, err
	}
	c.sendCredit(size)
	return Message{Tag: tag, Data: data, Recycled: recycled}, nil
}

// alloc is the buffer of a received message (Alloc's, or a new one).
func (c *Conn) alloc(tag int64, n int) (b []byte, recycled bool) {
	if c.Alloc != nil {
		if b = c.Alloc(tag, n); b != nil {
			return b[:n], true
		}
	}
	return make([]byte, n), false
}

// sendCredit credits the sender (never blocks: at most
// MaxInflight/InlineMax credits are outstanding, far below the socket's
// buffer).
func (c *Conn) sendCredit(size uint64) {
	_ = c.raw.Write(func(fd uintptr) bool {
		_, _ = unix.SendmsgN(int(fd), header(kindCredit, 0, size), nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		return true
	})
}

// recvMemfd maps a memfd frame's descriptor (c.fd).
func (c *Conn) recvMemfd(tag int64, size uint64) (Message, error) {
	f := os.NewFile(uintptr(c.fd), "memfd")
	defer f.Close()
	if size <= InlineMax || size > MaxMessage {
		return Message{}, fmt.Errorf("%w: a memfd message of %d bytes", ErrFrame, size)
	}
	data, err := samenode.MapSealed(f, int64(size))
	if err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrFrame, err)
	}
	// Fill the page tables in one call rather than a fault per page.
	_ = unix.Madvise(data, unix.MADV_POPULATE_READ)
	c.sendCredit(size)
	return Message{Tag: tag, Data: data, Mapped: true}, nil
}
