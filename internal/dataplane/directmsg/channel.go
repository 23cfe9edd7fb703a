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
//	u32 magic/version "ZTD1", u8 kind (1 inline, 2 memfd), i64 tag,
//	u64 size, then for inline the size bytes
//
// little endian. The receiver answers each memfd frame with a credit
// frame (kind 3, its size), so that a sender holds at most MaxInflight
// memfd bytes the receiver has not read. A message larger than InlineMax goes as one memfd sealed
// with samenode.RequiredSeals, attached to a frame without bytes; the
// receiver checks the seals and the size (samenode.MapSealed) and maps it
// read-only: no copy into the receiving function.
//
// The peer is not trusted: a frame that is truncated, oversized, of an
// unknown kind, announces a size it does not carry, has descriptors it
// should not have, or a memfd that is unsealed or of another size ends
// the channel with an error (every received descriptor closed).
package directmsg

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
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
	// MaxMessage bounds a memfd message (the sidecar path's cap).
	MaxMessage = 1 << 30

	// MaxInflight bounds the memfd bytes a sender has in a channel that
	// the receiver has not read yet (the kernel counts a frame's bytes
	// against the socket buffer, not its memfd's).
	MaxInflight = 16 << 20

	kindInline = 1
	kindMemfd  = 2
	kindCredit = 3 // receiver -> sender: a memfd's bytes were read
)

// ErrFrame is a peer's protocol violation.
var ErrFrame = errors.New("malformed direct-channel frame")

// Conn is one end of a direct channel.
type Conn struct {
	c        *net.UnixConn
	raw      syscall.RawConn
	wmu      sync.Mutex
	inflight uint64 // memfd bytes sent and not credited (under wmu)
	hdr      []byte // the receiver's header buffer
	fd       int    // the descriptor of the memfd frame just read
	buf      []byte // the receiver's frame buffer
	oob      []byte
}

// NewConn takes over f, a socketpair end.
func NewConn(f *os.File) (*Conn, error) {
	nc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return nil, err
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: not a unix socket", ErrFrame)
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		_ = uc.Close()
		return nil, err
	}
	return &Conn{c: uc, raw: rc}, nil
}

// Close closes the channel's end.
func (c *Conn) Close() error { return c.c.Close() }

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
func (c *Conn) Send(ctx context.Context, tag int64, data []byte) error {
	if len(data) > MaxMessage {
		return fmt.Errorf("message of %d bytes: at most %d", len(data), MaxMessage)
	}
	var oob []byte
	kind := byte(kindInline)
	iov := [][]byte{nil, data}
	if len(data) > InlineMax {
		f, err := samenode.NewSealed("msg", data)
		if err != nil {
			return err
		}
		defer f.Close()
		kind, iov[1], oob = kindMemfd, nil, unix.UnixRights(int(f.Fd()))
	}
	iov[0] = header(kind, tag, uint64(len(data)))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	defer c.deadline(ctx)()
	if kind == kindMemfd {
		// Back-pressure for memfds: wait for the receiver's credits.
		for c.inflight > 0 && c.inflight+uint64(len(data)) > MaxInflight {
			n, err := c.credit()
			if err != nil {
				return ctxErr(ctx, err)
			}
			c.inflight -= min(n, c.inflight)
		}
	}
	if err := c.sendFrame(ctx, iov, oob); err != nil {
		return err
	}
	if kind == kindMemfd {
		c.inflight += uint64(len(data))
	}
	return nil
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

// credit reads one credit frame from the receiver (under wmu).
func (c *Conn) credit() (uint64, error) {
	var h [HeaderSize + 1]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	var n, oobn int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), h[:], oob, unix.MSG_CMSG_CLOEXEC)
			switch rerr {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false
			}
			return true
		}
	})
	if err == nil && rerr == nil {
		if fds := samenode.Rights(oob[:oobn]); len(fds) > 0 {
			samenode.CloseFDs(fds)
			return 0, fmt.Errorf("%w: descriptors with a credit", ErrFrame)
		}
	}
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, os.NewSyscallError("recvmsg", rerr)
	case n == 0:
		return 0, os.NewSyscallError("recvmsg", unix.EPIPE)
	case n != HeaderSize || binary.LittleEndian.Uint32(h[:]) != Magic || h[4] != kindCredit:
		return 0, fmt.Errorf("%w: a bad credit frame", ErrFrame)
	}
	return binary.LittleEndian.Uint64(h[13:]), nil
}

// Message is a received message: Data, which for a memfd message is a
// read-only mapping (Mapped) to unmap with samenode.Unmap.
type Message struct {
	Tag    int64
	Data   []byte
	Mapped bool
}

// Recv reads the next message; io.EOF when the sender's end closed.
// Recv is not safe for concurrent use.
func (c *Conn) Recv() (Message, error) {
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
		return Message{Tag: tag, Data: append([]byte{}, c.buf[:n]...)}, nil
	case kindMemfd:
		return c.recvMemfd(tag, size)
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
	case rerr == unix.ECONNRESET:
		// The sender closed with credits it had not read: its frames
		// were all read before (the reset is reported once the queue is
		// empty), so this is its end.
		return 0, 0, 0, 0, io.EOF
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
	case kind == kindMemfd && memfd:
		if len(fds) != 1 || total != HeaderSize {
			return 0, 0, 0, 0, fmt.Errorf("%w: memfd frame of %d bytes with %d descriptors", ErrFrame, total, len(fds))
		}
		c.fd, fds = fds[0], nil
	case len(fds) != 0:
		return 0, 0, 0, 0, fmt.Errorf("%w: %d descriptors with a frame of kind %d", ErrFrame, len(fds), kind)
	}
	return total - HeaderSize, kind, tag, size, nil
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
	// Credit the sender (never blocks: at most MaxInflight/InlineMax
	// credits are outstanding, far below the socket's buffer).
	_ = c.raw.Write(func(fd uintptr) bool {
		_, _ = unix.SendmsgN(int(fd), header(kindCredit, 0, size), nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		return true
	})
	return Message{Tag: tag, Data: data, Mapped: true}, nil
}
