package directmsg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// The framings a direct channel's ends and the sidecars' brokers read
// from a peer: open requests (node socket, data-plane port), frames
// (socketpair, TCP), credits (both). The fuzz targets feed them
// arbitrary bytes: nothing may panic (a recovered panic counts as a
// failure here), every error is ErrFrame or the end, and what is read is
// what the bytes say.

// FuzzOpenRequest: an open request decodes or fails; one that decodes
// encodes back to the same bytes.
func FuzzOpenRequest(f *testing.F) {
	f.Add(OpenRequest{Auth: "zt1.x", Session: "s1", Group: "g", From: 1, To: 2}.encode())
	f.Add(OpenRequest{}.encode())
	f.Add([]byte("ZTN1\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := decodeOpen(b)
		if err != nil {
			return
		}
		if !bytes.Equal(q.encode(), b) {
			t.Fatalf("%q decodes to %+v, which encodes to %q", b, q, q.encode())
		}
	})
}

// FuzzTCPOpen: the bytes after "ZTC1" on the data-plane port: the broker
// answers (refused, nodirect, direct) or closes, and hands on a
// connection only for a request that decodes and passes its checks.
func FuzzTCPOpen(f *testing.F) {
	req := func(q OpenRequest, extra ...byte) []byte {
		b := q.encode()
		return append(append(binary.LittleEndian.AppendUint16(nil, uint16(len(b))), b...), extra...)
	}
	f.Add(req(OpenRequest{Auth: "good", Session: "s", Group: "g", From: 0, To: 1}))
	f.Add(req(OpenRequest{Auth: "good", Session: "s", Group: "g", From: 0, To: 7}))
	f.Add(req(OpenRequest{Auth: "bad", Session: "s", Group: "g"}))
	f.Add([]byte{0xff, 0xff})
	f.Add(req(OpenRequest{Auth: "good"})[:9])
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()
	var offered []OpenRequest
	var mu sync.Mutex
	b := &TCPBroker{
		Check: func(q OpenRequest) error {
			if q.Auth != "good" {
				return errors.New("refused")
			}
			return nil
		},
		Peer: func(OpenRequest, *net.TCPAddr) error { return nil },
		Offer: func(q OpenRequest, f *os.File) error {
			if q.To != 1 {
				return errors.New("not here")
			}
			mu.Lock()
			offered = append(offered, q)
			mu.Unlock()
			return f.Close()
		},
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		before := testutil.ToFloat64(tcpOpens.WithLabelValues("panic"))
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		offered = offered[:0]
		mu.Unlock()
		go func() {
			_, _ = c.Write(in)
			_ = c.(*net.TCPConn).CloseWrite()
		}()
		b.Serve(s)
		if got := testutil.ToFloat64(tcpOpens.WithLabelValues("panic")); got != before {
			t.Fatal("the broker panicked")
		}
		mu.Lock()
		defer mu.Unlock()
		for _, q := range offered {
			if len(in) < 2 {
				t.Fatalf("offered %+v for %d bytes", q, len(in))
			}
			n := int(binary.LittleEndian.Uint16(in))
			if d, err := decodeOpen(in[2 : 2+n]); err != nil || d != q || q.Auth != "good" {
				t.Fatalf("offered %+v for a request that decodes to %+v, %v", q, d, err)
			}
		}
	})
}

// packets splits b into a channel's frames: u16 length (bit 15: attach
// an unsealed memfd of the length's low bits in KiB, bit 14: a sealed
// one), then that many bytes; the rest is one last frame.
func packets(b []byte) (out [][]byte, fds []int16) {
	for len(b) >= 2 {
		h := binary.LittleEndian.Uint16(b)
		n := min(int(h&0x3fff), len(b)-2)
		out, b = append(out, b[2:2+n]), b[2+n:]
		fds = append(fds, int16(h&0xc000>>14))
	}
	if len(b) > 0 {
		out, fds = append(out, b), append(fds, 0)
	}
	return out, fds
}

func openFDs(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	return len(es)
}

// FuzzChannelFrames: a socketpair channel's frames from a hostile
// sender: Recv returns messages or ErrFrame or io.EOF, and closes every
// descriptor it does not keep.
func FuzzChannelFrames(f *testing.F) {
	frame := func(kind byte, size uint64, body []byte, fd uint16) []byte {
		b := append(rawHeader(kind, 3, size), body...)
		return append(binary.LittleEndian.AppendUint16(nil, uint16(len(b))|fd<<14), b...)
	}
	f.Add(frame(kindInline, 5, []byte("hello"), 0))
	f.Add(append(frame(kindInline, 0, nil, 0), frame(kindInline, 3, []byte("abc"), 0)...))
	f.Add(frame(kindCopy, InlineMax+1, nil, 2))
	f.Add(frame(kindMemfd, CopyMax+1, nil, 1))
	f.Add(frame(kindCredit, 10, nil, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		fdsBefore := openFDs(t)
		panicsBefore := testutil.ToFloat64(channelPanics)
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewConn(os.NewFile(uintptr(fds[1]), "r"))
		if err != nil {
			t.Fatal(err)
		}
		ps, attach := packets(b)
		var wg sync.WaitGroup
		wg.Go(func() {
			defer unix.Close(fds[0])
			for i, p := range ps {
				var oob []byte
				if attach[i] != 0 {
					size := 1024 * int(binary.LittleEndian.Uint16(append(p, 0, 0)[:2])&0x3ff)
					m := testMemfd(t, size, map[int16]int{1: 0, 2: samenode.RequiredSeals, 3: unix.F_SEAL_SHRINK}[attach[i]])
					defer m.Close()
					oob = unix.UnixRights(int(m.Fd()))
				}
				if err := unix.Sendmsg(fds[0], p, oob, nil, 0); err != nil {
					return // too large for the socket, or the receiver is gone
				}
			}
		})
		for {
			m, err := r.Recv()
			if err != nil {
				if !errors.Is(err, ErrFrame) && !errors.Is(err, io.EOF) {
					t.Fatalf("error %v", err)
				}
				break
			}
			if m.Mapped {
				_ = samenode.Unmap(m.Data)
			}
		}
		r.Close()
		wg.Wait()
		if got := testutil.ToFloat64(channelPanics); got != panicsBefore {
			t.Fatal("Recv panicked")
		}
		if n := openFDs(t); n != fdsBefore {
			t.Fatalf("%d descriptors open, %d before", n, fdsBefore)
		}
	})
}

// bytesConn is a connection whose peer sent r's bytes and then ended;
// what is written to it is kept in w.
type bytesConn struct {
	r *bytes.Reader
	w bytes.Buffer
}

func (c *bytesConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error)      { return c.w.Write(p) }
func (c *bytesConn) Close() error                     { return nil }
func (c *bytesConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *bytesConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *bytesConn) SetDeadline(time.Time) error      { return nil }
func (c *bytesConn) SetReadDeadline(time.Time) error  { return nil }
func (c *bytesConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzStreamFrames: a TCP channel's byte stream from a hostile sender:
// Recv returns the messages its frames carry, then ErrFrame or io.EOF;
// it never credits more than it read.
func FuzzStreamFrames(f *testing.F) {
	frame := func(kind byte, size uint64, body []byte) []byte { return append(rawHeader(kind, 1, size), body...) }
	f.Add(frame(kindInline, 5, []byte("hello")))
	f.Add(append(frame(kindInline, 0, nil), frame(kindInline, 3, []byte("abc"))...))
	f.Add(frame(kindInline, StreamCreditAt, nil))
	f.Add(frame(kindMemfd, 10, nil))
	f.Add(frame(kindInline, MaxMessage+1, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		panicsBefore := testutil.ToFloat64(channelPanics)
		bc := &bytesConn{r: bytes.NewReader(b)}
		c := &Conn{c: bc, stream: true}
		var read uint64
		for {
			m, err := c.Recv()
			if err != nil {
				if !errors.Is(err, ErrFrame) && !errors.Is(err, io.EOF) {
					t.Fatalf("error %v", err)
				}
				break
			}
			read += streamFrame(uint64(len(m.Data)))
		}
		if got := testutil.ToFloat64(channelPanics); got != panicsBefore {
			t.Fatal("Recv panicked")
		}
		var credited uint64
		for cr := bc.w.Bytes(); len(cr) > 0; cr = cr[HeaderSize:] {
			if len(cr) < HeaderSize || binary.LittleEndian.Uint32(cr) != Magic || cr[4] != kindCredit {
				t.Fatalf("wrote %x, not credits", bc.w.Bytes())
			}
			credited += binary.LittleEndian.Uint64(cr[13:])
		}
		if declared := declaredFrames(b); credited > declared {
			t.Fatalf("credited %d bytes, the frames whose headers came say %d (%d read whole)", credited, declared, read)
		}
	})
}

// declaredFrames is what the well-formed headers in a TCP channel's
// bytes announce, up to the first that is not (or the end): a receiver
// counts a frame at its header.
func declaredFrames(b []byte) uint64 {
	var sum uint64
	for len(b) >= HeaderSize {
		size := binary.LittleEndian.Uint64(b[13:])
		if binary.LittleEndian.Uint32(b) != Magic || b[4] != kindInline || size > MaxMessage {
			break
		}
		sum += streamFrame(size)
		b = b[HeaderSize:]
		if uint64(len(b)) < size {
			break
		}
		b = b[size:]
	}
	return sum
}

// FuzzCredits: a receiver's credits, read by the sender: on a
// socketpair, each must match the oldest memfd frame not credited; on a
// TCP channel, none may exceed what is outstanding. Anything else is
// ErrFrame, and what is outstanding never grows.
func FuzzCredits(f *testing.F) {
	credit := func(n uint64) []byte { return rawHeader(kindCredit, 0, n) }
	f.Add(uint64(3<<20), credit(1<<20))
	f.Add(uint64(100), append(credit(60), credit(40)...))
	f.Add(uint64(10), credit(11))
	f.Add(uint64(10), rawHeader(kindInline, 0, 1))
	f.Fuzz(func(t *testing.T, outstanding uint64, b []byte) {
		panicsBefore := testutil.ToFloat64(channelPanics)
		// TCP: the byte stream's credits.
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := net.FileConn(os.NewFile(uintptr(fds[0]), "s"))
		if err != nil {
			t.Fatal(err)
		}
		rc, err := nc.(*net.UnixConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		c := &Conn{c: nc, raw: rc, stream: true, inflight: outstanding}
		// What the socket takes (nothing reads it meanwhile).
		_ = unix.SetNonblock(fds[1], true)
		_, _ = unix.Write(fds[1], b)
		unix.Close(fds[1])
		for {
			before := c.inflight
			err := func() (err error) {
				defer c.recoverFrame(&err)
				return c.streamCredits(false)
			}()
			if c.inflight > before {
				t.Fatalf("outstanding %d -> %d", before, c.inflight)
			}
			if err != nil || c.inflight == before {
				break
			}
		}
		nc.Close()
		// Socketpair: each credit is a packet; memfd frames outstanding
		// of the sizes the first bytes say.
		fds, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewConn(os.NewFile(uintptr(fds[0]), "s"))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			size := outstanding >> (16 * i) & 0xffff
			s.unacked = append(s.unacked, unacked{size: size})
			s.inflight += size
		}
		for _, p := range splitCredits(b) {
			if unix.Sendmsg(fds[1], p, nil, nil, unix.MSG_DONTWAIT) != nil {
				break // the socket's queue is full (nothing reads it meanwhile)
			}
		}
		unix.Close(fds[1])
		s.wmu.Lock()
		err = func() (err error) {
			defer s.recoverFrame(&err)
			return s.credits(false)
		}()
		s.wmu.Unlock()
		var sum uint64
		for _, u := range s.unacked {
			sum += u.size
		}
		if sum != s.inflight {
			t.Fatalf("%d bytes outstanding in frames, %d counted", sum, s.inflight)
		}
		s.Close()
		if got := testutil.ToFloat64(channelPanics); got != panicsBefore {
			t.Fatal("reading credits panicked")
		}
	})
}

// splitCredits cuts b into packets of a credit frame's size (the last
// one shorter).
func splitCredits(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n := min(len(b), HeaderSize)
		out, b = append(out, b[:n]), b[n:]
	}
	return out
}
