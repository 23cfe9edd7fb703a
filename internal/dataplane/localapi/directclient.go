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
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// The client side of the fast path's member channel and open
// (fastdirect.go).

// ErrNoAttach: the sidecar does not know the attach operation (an older
// sidecar): the SDK joins through gRPC and uses the sidecar path.
var ErrNoAttach = errors.New("the sidecar has no member channels")

// View is a group's membership as a member channel pushes it.
type View struct {
	Epoch      uint64
	Size       uint32
	Mailbox    bool
	Live, Gone []uint32
}

// Push is one item of a member channel: a message (Msg), a view (View) or
// a direct channel's receiving end from rank From (Direct).
type Push struct {
	Msg    *Received
	View   *View
	Direct *os.File
	From   uint32
}

// MemberChannel is an attached member's connection to its sidecar.
type MemberChannel struct {
	c   *net.UnixConn
	fr  *fdReader
	r   *bufio.Reader
	wmu sync.Mutex // Release's writes
}

// fdReader reads a unix stream socket with recvmsg, keeping the
// descriptors that arrive (in order: each belongs to the next push that
// announces one; the sidecar sends each with its push's first byte).
type fdReader struct {
	rc  syscall.RawConn
	oob []byte
	mu  sync.Mutex
	fds []int
}

func (f *fdReader) Read(p []byte) (int, error) {
	var n, oobn int
	var rerr error
	err := f.rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), p, f.oob, unix.MSG_CMSG_CLOEXEC)
			if rerr == unix.EINTR {
				continue
			}
			return rerr != unix.EAGAIN
		}
	})
	if err == nil && rerr == nil && oobn > 0 {
		f.mu.Lock()
		f.fds = append(f.fds, samenode.Rights(f.oob[:oobn])...)
		f.mu.Unlock()
	}
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, os.NewSyscallError("recvmsg", rerr)
	case n == 0 && len(p) > 0:
		return 0, io.EOF
	}
	return n, nil
}

func (f *fdReader) next() (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.fds) == 0 {
		return -1, false
	}
	fd := f.fds[0]
	f.fds = f.fds[1:]
	return fd, true
}

func (f *fdReader) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	samenode.CloseFDs(f.fds)
	f.fds = nil
}

func (c *MessageClient) dialUnix() (*net.UnixConn, *fdReader, error) {
	nc, err := net.Dial("unix", c.socket)
	if err != nil {
		return nil, nil, err
	}
	uc := nc.(*net.UnixConn)
	rc, err := uc.SyscallConn()
	if err != nil {
		_ = uc.Close()
		return nil, nil, err
	}
	return uc, &fdReader{rc: rc, oob: make([]byte, unix.CmsgSpace(8*4))}, nil
}

// Attach joins rank of group as the sidecar's gRPC Join does (without
// waiting for the other ranks) with this member's channel attached.
// ErrNoAttach: the sidecar is older (join through gRPC instead).
func (c *MessageClient) Attach(ctx context.Context, session, group string, rank, size uint32, mailbox bool, invocation string) (*MemberChannel, bool, error) {
	if len(session) > maxNames || len(group) > maxNames || len(invocation) > maxNames {
		return nil, false, &MessageError{Reason: ReasonMsgInvalid, Message: "session, group and invocation names are at most 1 KiB"}
	}
	var flags uint8
	if mailbox {
		flags = 1
	}
	if c.LendFiles {
		flags |= flagLendFiles
	}
	if c.TCPChannels {
		flags |= flagTCP
	}
	uc, fr, err := c.dialUnix()
	if err != nil {
		return nil, false, &MessageError{Reason: "UNAVAILABLE", Message: "messaging socket: " + err.Error()}
	}
	stop := context.AfterFunc(ctx, func() { _ = uc.SetDeadline(time.Now()) })
	defer stop()
	b := appendMsgRequest(nil, opAttach, flags, session, group, rank, size, 0, timeoutOf(ctx), len(invocation))
	b = append(append(append(b, session...), group...), invocation...)
	mc := &MemberChannel{c: uc, fr: fr, r: bufio.NewReaderSize(fr, 256<<10)}
	_, err = uc.Write(b)
	var resp *msgResponse
	if err == nil {
		resp, err = readMsgResponse(mc.r)
	}
	if err != nil {
		mc.Close()
		if ctx.Err() != nil {
			return nil, false, &MessageError{Reason: ReasonMsgTimeout, Message: "attach: " + context.Cause(ctx).Error()}
		}
		return nil, false, &MessageError{Reason: "UNAVAILABLE", Message: "messaging socket: " + err.Error()}
	}
	if resp.err {
		mc.Close()
		if resp.reason == ReasonBadPayload && strings.Contains(string(resp.body), "unknown operation") {
			return nil, false, ErrNoAttach
		}
		return nil, false, &MessageError{Reason: resp.reason, Message: string(resp.body)}
	}
	_ = uc.SetDeadline(time.Time{})
	return mc, resp.flags&flagMailbox != 0, nil
}

func timeoutOf(ctx context.Context) int64 {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d).Milliseconds(), 1)
	}
	return 0
}

// Next reads the next push (one reader at a time).
func (m *MemberChannel) Next() (Push, error) {
	resp, err := readMsgResponse(m.r)
	if err != nil {
		return Push{}, err
	}
	switch resp.status {
	case pushMessage:
		out := &Received{From: resp.from, Tag: resp.tag, Size: resp.size}
		switch {
		case resp.flags&1 == 0:
			out.Data = resp.body
		case resp.flags&flagLent != 0:
			path, token, ok := strings.Cut(string(resp.body), "\x00")
			if !ok || token == "" {
				return Push{}, fmt.Errorf("%w: a lent file without its token", errMsgFrame)
			}
			out.Path, out.Token = path, token
		default:
			out.Path = string(resp.body)
		}
		return Push{Msg: out}, nil
	case pushView:
		v, err := parseView(resp.body)
		return Push{View: v}, err
	case pushDirect:
		fd, ok := m.fr.next()
		if !ok {
			return Push{}, fmt.Errorf("%w: a direct channel push without its descriptor", errMsgFrame)
		}
		return Push{Direct: os.NewFile(uintptr(fd), "direct"), From: resp.from}, nil
	default:
		return Push{}, fmt.Errorf("%w: push kind %d", errMsgFrame, resp.status)
	}
}

func parseView(b []byte) (*View, error) {
	bad := fmt.Errorf("%w: a view of %d bytes", errMsgFrame, len(b))
	if len(b) < 17 {
		return nil, bad
	}
	v := &View{Epoch: binary.LittleEndian.Uint64(b), Size: binary.LittleEndian.Uint32(b[8:]), Mailbox: b[12] != 0}
	b = b[13:]
	for _, l := range []*[]uint32{&v.Live, &v.Gone} {
		if len(b) < 4 {
			return nil, bad
		}
		n := int(binary.LittleEndian.Uint32(b))
		b = b[4:]
		if n > len(b)/4 {
			return nil, bad
		}
		for i := range n {
			*l = append(*l, binary.LittleEndian.Uint32(b[4*i:]))
		}
		b = b[4*n:]
	}
	return v, nil
}

// Release gives lent files back (Received.Token) for the sidecar to fill
// again; a channel that is closed or broken drops them (the sidecar
// forgets unreleased files after a while).
func (m *MemberChannel) Release(tokens ...string) {
	n := 0
	for i, t := range tokens {
		n += len(t)
		if i > 0 {
			n++
		}
	}
	b := appendMsgRequest(make([]byte, 0, 4+reqFixed+n), opRelease, 0, "", "", 0, 0, 0, 0, n)
	for i, t := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, t...)
	}
	m.wmu.Lock()
	_, _ = m.c.Write(b)
	m.wmu.Unlock()
}

// Close detaches (the membership stays until Leave or the invocation's
// end).
func (m *MemberChannel) Close() error {
	err := m.c.Close()
	m.fr.closeAll()
	return err
}

// Open asks for a direct channel from rank from to rank to: its sending
// end, or nil (nodirect: send through the sidecar for the group's
// lifetime).
func (c *MessageClient) Open(ctx context.Context, session, group string, from, to uint32) (*os.File, error) {
	uc, fr, err := c.dialUnix()
	if err != nil {
		return nil, &MessageError{Reason: "UNAVAILABLE", Message: "messaging socket: " + err.Error()}
	}
	defer uc.Close()
	defer fr.closeAll()
	stop := context.AfterFunc(ctx, func() { _ = uc.SetDeadline(time.Now()) })
	defer stop()
	var flags uint8
	if c.TCPChannels {
		flags = flagTCP
	}
	b := appendMsgRequest(nil, opOpen, flags, session, group, from, to, 0, timeoutOf(ctx), 0)
	b = append(append(b, session...), group...)
	_, err = uc.Write(b)
	var resp *msgResponse
	if err == nil {
		resp, err = readMsgResponse(bufio.NewReader(fr))
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, &MessageError{Reason: ReasonMsgTimeout, Message: "open: " + context.Cause(ctx).Error()}
		}
		return nil, &MessageError{Reason: "UNAVAILABLE", Message: "messaging socket: " + err.Error()}
	}
	if resp.err {
		return nil, &MessageError{Reason: resp.reason, Message: string(resp.body)}
	}
	if resp.flags&flagDirect == 0 {
		return nil, nil
	}
	fd, ok := fr.next()
	if !ok {
		return nil, &MessageError{Reason: "INTERNAL", Message: "open: direct without a descriptor"}
	}
	return os.NewFile(uintptr(fd), "direct"), nil
}
