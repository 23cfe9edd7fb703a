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
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Direct channels across nodes (docs/messaging.md, "Direct channels
// across nodes"): a TCP connection between the two functions' pods that
// their sidecars opened on the data-plane port and authenticated
// (crossnode.go), then handed each function its end. The frames are the
// same as a socketpair's, but every message is an inline frame (no
// descriptor crosses TCP), written with its header in one writev and read
// off the byte stream.
//
// A frame on a byte stream cannot be taken back half written, so a send
// must never start one its receiver will not read whole: a send that
// timed out inside a frame would leave the channel cut. So the receiver
// reads every frame its sender may send, whether or not its inbox has
// room, and the sender keeps to a window, in frame bytes (header and
// body) sent and not credited: it starts a frame only while that is
// under StreamCreditAt, or when the frame keeps it within MaxInflight.
// Its wait for credits is the one a send's deadline may end, before a
// byte of the frame is written. The receiver credits what it read (a
// frame of kind 3 on the reverse direction, carrying a byte count) once
// it owes StreamCreditAt or more and its inbox is under its cap: the
// inbox's back-pressure. A sender beyond its window breaks the protocol:
// the receiver drops the channel (its memory stays bounded by its inbox,
// MaxInflight and one frame).

// streamPrealloc is the largest body a stream receiver allocates whole
// when its header arrives; a larger one grows as its bytes come, so a
// peer cannot make the receiver allocate more than it sent (plus this).
const streamPrealloc = 64 << 20

// StreamCreditAt is both how many uncredited bytes a stream sender may
// have and still start a frame of any size, and how much a receiver owes
// before it credits.
const StreamCreditAt = MaxInflight / 2

// streamFrame is a frame's bytes for the window.
func streamFrame(size uint64) uint64 { return HeaderSize + size }

// closeLinger bounds how long a TCP channel's sending end, closed, waits
// for its receiver to read what was sent and close its end.
const closeLinger = 30 * time.Second

// CloseSend closes a channel's sending end without losing what it sent.
// A TCP socket closed with unread bytes (a credit of its receiver's)
// resets the connection, and the kernel drops the frames it had not
// transmitted yet; so a TCP channel sends its FIN after every byte queued
// and reads, discarding, the receiver's credits until the receiver closes
// its end (at most closeLinger), then closes. Other channels: Close (a
// socketpair's receiver reads past the reset, channel.go).
func (c *Conn) CloseSend() error {
	tc, ok := c.c.(*net.TCPConn)
	if !c.stream || !ok || tc.CloseWrite() != nil {
		return c.Close()
	}
	go func() {
		_ = tc.SetReadDeadline(time.Now().Add(closeLinger))
		_, _ = io.Copy(io.Discard, tc)
		_ = c.Close()
	}()
	return nil
}

// Stream: the channel is a TCP connection across nodes.
func (c *Conn) Stream() bool { return c.stream }

// sendStream writes one inline frame into a TCP channel, once the window
// allows it (until ctx's deadline; nothing is written when it ends
// first). The frame is then written whole: its receiver reads it whatever
// its inbox holds.
func (c *Conn) sendStream(ctx context.Context, tag int64, data []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := streamFrame(uint64(len(data)))
	if err := c.streamWindow(ctx, n); err != nil {
		return err
	}
	c.inflight += n
	bufs := net.Buffers{header(kindInline, tag, uint64(len(data))), data}
	_, err := bufs.WriteTo(c.c)
	return err
}

// streamWindow waits, until ctx's deadline, while a frame of n bytes may
// not start, reading the receiver's credits (under wmu). Under
// StreamCreditAt uncredited bytes no credit can be on its way (the
// receiver credits once it owes that much): nothing is read.
func (c *Conn) streamWindow(ctx context.Context, n uint64) error {
	if c.inflight < StreamCreditAt {
		return nil
	}
	if c.raw == nil {
		rc, err := c.c.(*net.TCPConn).SyscallConn()
		if err != nil {
			return err
		}
		c.raw = rc
	}
	wait := false
	for {
		if err := c.streamCredits(wait); err != nil {
			return ctxErr(ctx, err)
		}
		if c.inflight < StreamCreditAt || c.inflight+n <= MaxInflight {
			return nil
		}
		if !wait {
			wait = true
			undo := c.deadline(ctx)
			defer func() {
				undo()
				_ = c.c.SetDeadline(time.Time{}) // not for the frame's write
			}()
		}
	}
}

// streamCredits reads the credit frames the receiver sent (under wmu):
// those already there, or, with wait, until one came whole.
func (c *Conn) streamCredits(wait bool) error {
	if c.cbuf == nil {
		c.cbuf = make([]byte, 0, 64*HeaderSize)
	}
	for {
		var got int
		var rerr error
		buf := c.cbuf[len(c.cbuf):cap(c.cbuf)]
		err := c.raw.Read(func(fd uintptr) bool {
			for {
				got, rerr = unix.Read(int(fd), buf)
				switch rerr {
				case unix.EINTR:
					continue
				case unix.EAGAIN:
					return !wait
				}
				return true
			}
		})
		switch {
		case err != nil:
			return err
		case rerr == unix.EAGAIN:
			return nil
		case rerr != nil:
			return os.NewSyscallError("read", rerr)
		case got == 0:
			return os.NewSyscallError("read", unix.EPIPE)
		}
		c.cbuf = c.cbuf[:len(c.cbuf)+got]
		for len(c.cbuf) >= HeaderSize {
			h := c.cbuf[:HeaderSize]
			size := binary.LittleEndian.Uint64(h[13:])
			if binary.LittleEndian.Uint32(h) != Magic || h[4] != kindCredit || size > c.inflight {
				return fmt.Errorf("%w: a bad credit (%d bytes, %d outstanding)", ErrFrame, size, c.inflight)
			}
			c.inflight -= size
			c.cbuf = append(c.cbuf[:0], c.cbuf[HeaderSize:]...)
			wait = false
		}
	}
}

// Hold, for a stream channel's receiver, says whether its inbox is over
// its cap: credits wait until Release. Set before the first Recv.
func (c *Conn) SetHold(hold func() bool) { c.hold = hold }

// Release sends the credits a stream channel's receiver owes, now that
// its inbox is under its cap again (a no-op for other channels).
func (c *Conn) Release() {
	if c.stream {
		c.streamCredit()
	}
}

// streamCredit sends what the receiver owes, when it owes StreamCreditAt or
// more and its inbox has room.
func (c *Conn) streamCredit() {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	if c.owed < StreamCreditAt || (c.hold != nil && c.hold()) {
		return
	}
	if _, err := c.c.Write(header(kindCredit, 0, c.owed)); err == nil {
		c.owed = 0
	}
}

// recvStream reads the next frame of a TCP channel. The sender's end
// closing, or breaking inside a frame (its process died), is io.EOF: a
// frame not read whole was never sent whole (its Send had not returned).
func (c *Conn) recvStream() (Message, error) {
	if c.br == nil {
		c.br = bufio.NewReaderSize(c.c, 64<<10)
		c.hdr = make([]byte, HeaderSize)
	}
	c.idle.Store(c.br.Buffered() == 0) // waiting for a frame: nothing of one read yet
	_, err := io.ReadFull(c.br, c.hdr)
	c.idle.Store(false)
	if err != nil {
		return Message{}, streamEnd(err)
	}
	kind, tag, size := c.hdr[4], int64(binary.LittleEndian.Uint64(c.hdr[5:])), binary.LittleEndian.Uint64(c.hdr[13:])
	switch {
	case binary.LittleEndian.Uint32(c.hdr) != Magic:
		return Message{}, fmt.Errorf("%w: bad header", ErrFrame)
	case kind != kindInline:
		return Message{}, fmt.Errorf("%w: kind %d on a TCP channel (only inline frames cross nodes)", ErrFrame, kind)
	case size > MaxMessage:
		return Message{}, fmt.Errorf("%w: a message of %d bytes (at most %d)", ErrFrame, size, MaxMessage)
	}
	c.cmu.Lock()
	owed := c.owed
	if owed >= StreamCreditAt && owed+streamFrame(size) > MaxInflight {
		c.cmu.Unlock()
		return Message{}, fmt.Errorf("%w: a frame of %d bytes beyond the sender's window (%d bytes not credited)", ErrFrame, size, owed)
	}
	c.owed += streamFrame(size)
	c.cmu.Unlock()
	defer c.streamCredit()
	if size <= streamPrealloc {
		data, recycled := c.alloc(tag, int(size))
		if _, err := io.ReadFull(c.br, data); err != nil {
			return Message{}, streamEnd(err)
		}
		return Message{Tag: tag, Data: data, Recycled: recycled}, nil
	}
	data := make([]byte, streamPrealloc, streamPrealloc*2)
	if _, err := io.ReadFull(c.br, data); err != nil {
		return Message{}, streamEnd(err)
	}
	for uint64(len(data)) < size {
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)] // grows by doubling
		}
		n := min(uint64(cap(data)), size) - uint64(len(data))
		m, err := io.ReadFull(c.br, data[len(data):len(data)+int(n)])
		data = data[:len(data)+m]
		if err != nil {
			return Message{}, streamEnd(err)
		}
	}
	return Message{Tag: tag, Data: data}, nil
}

// streamEnd is the error of a TCP channel's read that failed: its end
// (closed, reset by a sender that exited, cut inside a frame, its node
// silent past the keepalive) or another.
func streamEnd(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ETIMEDOUT) {
		return io.EOF
	}
	return err
}

// Quiet, for a TCP channel's receiver: Recv waits for a frame's first
// byte, and none is buffered or in the socket. A receiver whose view says
// the sender is gone may then take the channel for ended (its node may be
// gone without a FIN) and Close it: Recv returns an error, nothing read
// is lost.
func (c *Conn) Quiet() bool {
	if !c.stream || !c.idle.Load() {
		return false
	}
	rc, err := c.c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return false
	}
	n := -1
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n == 0 && c.idle.Load()
}
