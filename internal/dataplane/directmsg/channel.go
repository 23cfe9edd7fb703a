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
// little endian. A message larger than InlineMax goes as one memfd sealed
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

	kindInline = 1
	kindMemfd  = 2
)

// ErrFrame is a peer's protocol violation.
var ErrFrame = errors.New("malformed direct-channel frame")

// Conn is one end of a direct channel.
type Conn struct {
	c   *net.UnixConn
	raw syscall.RawConn
	wmu sync.Mutex
	buf []byte // the receiver's frame buffer
	oob []byte
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
	if d, ok := ctx.Deadline(); ok {
		_ = c.c.SetWriteDeadline(d)
	} else {
		_ = c.c.SetWriteDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = c.c.SetWriteDeadline(time.Now()) })
	defer stop()
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
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return err
	}
	if serr != nil {
		return os.NewSyscallError("sendmsg", serr)
	}
	return nil
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
		c.buf = make([]byte, HeaderSize+InlineMax+1)
		c.oob = make([]byte, unix.CmsgSpace(4*4))
	}
	var n, oobn, flags int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), c.buf, c.oob, unix.MSG_CMSG_CLOEXEC)
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
		fds = rights(c.oob[:oobn])
	}
	defer closeAll(fds)
	switch {
	case err != nil:
		return Message{}, err
	case rerr != nil:
		return Message{}, os.NewSyscallError("recvmsg", rerr)
	case n == 0 && len(fds) == 0:
		return Message{}, io.EOF
	case flags&unix.MSG_TRUNC != 0:
		return Message{}, fmt.Errorf("%w: a frame over %d bytes", ErrFrame, HeaderSize+InlineMax)
	case flags&unix.MSG_CTRUNC != 0:
		return Message{}, fmt.Errorf("%w: too many descriptors", ErrFrame)
	case n < HeaderSize || binary.LittleEndian.Uint32(c.buf) != Magic:
		return Message{}, fmt.Errorf("%w: bad header (%d bytes)", ErrFrame, n)
	}
	kind, tag, size := c.buf[4], int64(binary.LittleEndian.Uint64(c.buf[5:])), binary.LittleEndian.Uint64(c.buf[13:])
	switch kind {
	case kindInline:
		if len(fds) != 0 || size != uint64(n-HeaderSize) {
			return Message{}, fmt.Errorf("%w: inline frame of %d bytes announcing %d, %d descriptors", ErrFrame, n-HeaderSize, size, len(fds))
		}
		return Message{Tag: tag, Data: append([]byte{}, c.buf[HeaderSize:n]...)}, nil
	case kindMemfd:
		if len(fds) != 1 || n != HeaderSize || size <= InlineMax || size > MaxMessage {
			return Message{}, fmt.Errorf("%w: memfd frame of %d bytes announcing %d, %d descriptors", ErrFrame, n, size, len(fds))
		}
		f := os.NewFile(uintptr(fds[0]), "memfd")
		fds = nil
		data, err := samenode.MapSealed(f, int64(size))
		_ = f.Close()
		if err != nil {
			return Message{}, fmt.Errorf("%w: %v", ErrFrame, err)
		}
		return Message{Tag: tag, Data: data, Mapped: true}, nil
	default:
		return Message{}, fmt.Errorf("%w: kind %d", ErrFrame, kind)
	}
}

func rights(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
