package directmsg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// tcpPair is a TCP channel s -> r over a real loopback connection, as
// the sidecars hand it over (raw: the receiver's net.Conn itself, for a
// hostile sender's bytes).
func tcpPair(t *testing.T) (s, r *Conn, rawS net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	conn := func(c net.Conn) *Conn {
		f, err := c.(*net.TCPConn).File()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		k, err := NewConn(f)
		if err != nil || !k.Stream() {
			t.Fatalf("NewConn of a TCP socket: %v", err)
		}
		return k
	}
	s, r = conn(dialed), conn(accepted)
	t.Cleanup(func() { s.Close(); r.Close() })
	return s, r, s.c
}

// Every size, in order, on a byte stream; the end reads as io.EOF.
func TestStreamSizes(t *testing.T) {
	s, r, _ := tcpPair(t)
	ctx := context.Background()
	sizes := []int{0, 1, 100, InlineMax + 1, CopyMax + 1, 9 << 20, streamPrealloc + 5<<20}
	go func() {
		for i, n := range sizes {
			if err := s.Send(ctx, int64(i), fill(n, byte(i))); err != nil {
				t.Error(err)
				return
			}
		}
		s.CloseSend() // its last frames go out whatever credits come meanwhile
	}()
	for i, n := range sizes {
		m, err := r.Recv()
		if err != nil || m.Tag != int64(i) || m.Mapped || !bytes.Equal(m.Data, fill(n, byte(i))) {
			t.Fatalf("message %d (%d bytes): %v, tag %d, %d bytes", i, n, err, m.Tag, len(m.Data))
		}
	}
	if _, err := r.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the close: %v, want io.EOF", err)
	}
}

// A receiver whose inbox is full holds its credits: its sender's sends
// time out before a byte of their frame is written, so the stream stays
// whole; once the inbox has room the credits go out and the sender goes
// on. Frames larger than the window pass alone.
func TestStreamWindow(t *testing.T) {
	s, r, _ := tcpPair(t)
	var full atomic.Bool
	full.Store(true)
	r.SetHold(full.Load)
	got := make(chan Message, 1000)
	go func() {
		for {
			m, err := r.Recv()
			if err != nil {
				close(got)
				return
			}
			got <- m
		}
	}()
	ctx := context.Background()
	const size = 1 << 20
	sent := 0
	for ; sent < 100; sent++ {
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := s.Send(sctx, int64(sent), fill(size, byte(sent)))
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// Held at the window: every frame sent was read whole, none cut.
	if want := int((MaxInflight + size) / streamFrame(size)); sent < int(StreamCreditAt/streamFrame(size)) || sent > want {
		t.Fatalf("held after %d messages of 1 MiB; want at most %d", sent, want)
	}
	for i := range sent {
		if m := <-got; m.Tag != int64(i) || !bytes.Equal(m.Data, fill(size, byte(i))) {
			t.Fatalf("message %d: tag %d", i, m.Tag)
		}
	}
	// The inbox has room: the credits go, the sender goes on, and a
	// frame larger than the window passes.
	full.Store(false)
	r.Release()
	big := fill(MaxInflight*2, 9)
	go func() {
		for i := sent; i < sent+20; i++ {
			if err := s.Send(ctx, int64(i), fill(size, byte(i))); err != nil {
				t.Error(err)
				return
			}
		}
		if err := s.Send(ctx, -1, big); err != nil {
			t.Error(err)
		}
	}()
	for i := sent; i < sent+20; i++ {
		if m := <-got; m.Tag != int64(i) || !bytes.Equal(m.Data, fill(size, byte(i))) {
			t.Fatalf("message %d after the hold: tag %d", i, m.Tag)
		}
	}
	if m := <-got; m.Tag != -1 || !bytes.Equal(m.Data, big) {
		t.Fatalf("the large frame: tag %d, %d bytes", m.Tag, len(m.Data))
	}
}

// A hostile sender: frames of another kind, beyond the window, beyond the
// largest message, bad magic end the channel with ErrFrame; a hostile
// receiver's bad credit ends the sender's.
func TestStreamHostilePeers(t *testing.T) {
	frame := func(kind byte, size uint64, body []byte) []byte {
		return append(header(kind, 1, size), body...)
	}
	for name, b := range map[string][]byte{
		"a memfd frame":   frame(kindMemfd, 1<<20, nil),
		"a copy frame":    frame(kindCopy, 1<<20, nil),
		"a credit frame":  frame(kindCredit, 10, nil),
		"bad magic":       append([]byte("XXXX"), frame(kindInline, 0, nil)[4:]...),
		"over the limit":  frame(kindInline, MaxMessage+1, nil),
		"past the window": append(frame(kindInline, StreamCreditAt, make([]byte, StreamCreditAt)), frame(kindInline, MaxInflight, nil)...),
	} {
		t.Run(name, func(t *testing.T) {
			_, r, raw := tcpPair(t)
			r.SetHold(func() bool { return true }) // no credits: the window is the sender's to keep
			go func() { _, _ = raw.Write(b) }()
			var err error
			for err == nil {
				_, err = r.Recv()
			}
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("%v, want ErrFrame", err)
			}
		})
	}
	// A frame cut by its sender's end is the end, not a message.
	_, r, raw := tcpPair(t)
	_, _ = raw.Write(frame(kindInline, 100, []byte("short")))
	raw.Close()
	if _, err := r.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("a cut frame: %v, want io.EOF", err)
	}
	// A credit for more than was sent.
	s, r2, _ := tcpPair(t)
	r2.SetHold(func() bool { return true })
	go func() {
		for {
			if _, err := r2.Recv(); err != nil {
				return
			}
		}
	}()
	ctx := context.Background()
	for range 9 {
		if err := s.Send(ctx, 0, make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r2.c.Write(header(kindCredit, 0, 1<<30)); err != nil {
		t.Fatal(err)
	}
	var err error
	for range 20 {
		if err = s.Send(ctx, 0, make([]byte, 1<<20)); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrFrame) {
		t.Fatalf("after a forged credit: %v, want ErrFrame", err)
	}
}

// BenchmarkStreamPingPong: one message each way over two TCP channels
// (an echo at the other end), as bench/messaging's Fig. 7 does between
// pods.
func BenchmarkStreamPingPong(b *testing.B) {
	for _, size := range []int{64, 64 << 10, 1 << 20, 16 << 20} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			t := &testing.T{}
			s1, r1, _ := tcpPair(t)
			s2, r2, _ := tcpPair(t)
			defer func() { s1.Close(); r1.Close(); s2.Close(); r2.Close() }()
			ctx := context.Background()
			go func() {
				for {
					m, err := r1.Recv()
					if err != nil {
						return
					}
					if s2.Send(ctx, m.Tag, m.Data) != nil {
						return
					}
				}
			}()
			data := fill(size, 1)
			b.SetBytes(int64(2 * size))
			b.ResetTimer()
			for range b.N {
				if err := s1.Send(ctx, 0, data); err != nil {
					b.Fatal(err)
				}
				if _, err := r2.Recv(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
