package directmsg

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// pair is a direct channel s -> r over a real SOCK_SEQPACKET socketpair,
// as the sidecars make it.
func pair(t *testing.T) (s, r *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s, err = NewConn(os.NewFile(uintptr(fds[0]), "s")); err != nil {
		t.Fatal(err)
	}
	if r, err = NewConn(os.NewFile(uintptr(fds[1]), "r")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); r.Close() })
	return s, r
}

func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// Every size class arrives whole and in order: inline, a reused memfd
// copied out, a sealed memfd mapped.
func TestSizes(t *testing.T) {
	s, r := pair(t)
	ctx := context.Background()
	sizes := []int{0, 1, InlineMax, InlineMax + 1, 1 << 20, CopyMax, CopyMax + 1, 9 << 20}
	go func() {
		for i, n := range sizes {
			if err := s.Send(ctx, int64(i), fill(n, byte(i))); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i, n := range sizes {
		m, err := r.Recv()
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if m.Tag != int64(i) || !bytes.Equal(m.Data, fill(n, byte(i))) {
			t.Fatalf("message %d (%d bytes): tag %d, %d bytes, not what was sent", i, n, m.Tag, len(m.Data))
		}
		if want := n > CopyMax; m.Mapped != want {
			t.Fatalf("message of %d bytes: mapped %v, want %v", n, m.Mapped, want)
		}
		if m.Mapped {
			_ = samenode.Unmap(m.Data)
		}
	}
}

// The sender reuses its memfds once credited: messages exchanged one
// at a time (a ping-pong, a collective's steps) take one memfd in all,
// and a stream that runs ahead of its receiver stays whole: no message
// read is changed by the sender writing later ones into the same pages
// (the receiver holds copies).
func TestCopyMemfdsAreReused(t *testing.T) {
	s, r := pair(t)
	ctx := context.Background()
	msgs := make([][]byte, 8)
	for i := range msgs {
		msgs[i] = fill(1<<20, byte(i))
	}
	for i := range 50 {
		if err := s.Send(ctx, int64(i), msgs[i%8]); err != nil {
			t.Fatal(err)
		}
		if m, err := r.Recv(); err != nil || !bytes.Equal(m.Data, msgs[i%8]) {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	s.wmu.Lock()
	made := s.pooled
	s.wmu.Unlock()
	if made != 1 {
		t.Fatalf("%d memfds made for 50 messages sent one at a time; want 1", made)
	}

	const n = 200
	done := make(chan error, 1)
	go func() {
		for i := range n {
			if err := s.Send(ctx, int64(i), msgs[i%8]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var kept [][]byte
	for i := range n {
		m, err := r.Recv()
		if err != nil || m.Tag != int64(i) {
			t.Fatalf("message %d: tag %d, %v", i, m.Tag, err)
		}
		kept = append(kept, m.Data)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i, d := range kept {
		if !bytes.Equal(d, msgs[i%8]) {
			t.Fatalf("message %d changed after it was read", i)
		}
	}
}

// Back-pressure: a receiver that reads nothing holds the sender back at
// MaxInflight bytes of memfds, with a timeout and nothing broken; once it
// reads, every message arrives in order and sending goes on.
func TestCopyBackPressure(t *testing.T) {
	s, r := pair(t)
	msg := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 1<<20) }
	sent := 0
	for ; sent < 100; sent++ {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := s.Send(ctx, int64(sent), msg(sent))
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if sent == 100 || sent > MaxInflight>>20 {
		t.Fatalf("held back after %d MiB; want at most %d", sent, MaxInflight>>20)
	}
	go func() {
		if err := s.Send(context.Background(), 999, []byte("after")); err != nil {
			t.Error(err)
		}
	}()
	for i := range sent {
		m, err := r.Recv()
		if err != nil || m.Tag != int64(i) || !bytes.Equal(m.Data, msg(i)) {
			t.Fatalf("message %d after the hold: %v", i, err)
		}
	}
	if m, err := r.Recv(); err != nil || string(m.Data) != "after" {
		t.Fatalf("the send after the hold: %v", err)
	}
}

func rawHeader(kind byte, tag int64, size uint64) []byte {
	h := binary.LittleEndian.AppendUint32(nil, Magic)
	h = append(h, kind)
	h = binary.LittleEndian.AppendUint64(h, uint64(tag))
	return binary.LittleEndian.AppendUint64(h, size)
}

// A hostile sender's copy frames end the channel with ErrFrame, every
// descriptor closed, never a message that is not what the frame says
// and never a read that hangs.
func TestHostileCopyFrames(t *testing.T) {
	memfd := func(size int) *os.File { return testMemfd(t, size, 0) }
	pipe := func() *os.File {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pw.Close() }) // open: a read of pr would wait forever
		return pr
	}
	regular := func() *os.File {
		f, err := os.CreateTemp(t.TempDir(), "f")
		if err != nil {
			t.Fatal(err)
		}
		_ = f.Truncate(1 << 20)
		return f
	}
	const mib = 1 << 20
	cases := map[string]struct {
		b   []byte
		fds []*os.File
	}{
		"a pipe":                {rawHeader(kindCopy, 0, mib), []*os.File{pipe()}},
		"a regular file":        {rawHeader(kindCopy, 0, mib), []*os.File{regular()}},
		"a memfd short of size": {rawHeader(kindCopy, 0, mib), []*os.File{memfd(mib - 1)}},
		"a sealed memfd short of size": {rawHeader(kindCopy, 0, mib),
			[]*os.File{testMemfd(t, mib-1, fixedSize)}},
		"no descriptor":           {rawHeader(kindCopy, 0, mib), nil},
		"two descriptors":         {rawHeader(kindCopy, 0, mib), []*os.File{memfd(mib), memfd(mib)}},
		"bytes with it":           {append(rawHeader(kindCopy, 0, mib), 1, 2, 3), []*os.File{memfd(mib)}},
		"over CopyMax":            {rawHeader(kindCopy, 0, CopyMax+1), []*os.File{memfd(CopyMax + 1)}},
		"small enough for inline": {rawHeader(kindCopy, 0, 10), []*os.File{memfd(10)}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s, r := pair(t)
			fd := func() int { // the raw sending end
				var fd int
				_ = s.raw.Control(func(x uintptr) { fd = int(x) })
				return fd
			}()
			if err := unix.Sendmsg(fd, append(rawHeader(kindInline, 1, 2), 'o', 'k'), nil, nil, 0); err != nil {
				t.Fatal(err)
			}
			var oob []byte
			if len(c.fds) > 0 {
				var fds []int
				for _, f := range c.fds {
					fds = append(fds, int(f.Fd()))
				}
				oob = unix.UnixRights(fds...)
			}
			if err := unix.Sendmsg(fd, c.b, oob, nil, 0); err != nil {
				t.Fatal(err)
			}
			for _, f := range c.fds {
				f.Close()
			}
			if m, err := r.Recv(); err != nil || string(m.Data) != "ok" {
				t.Fatalf("the good frame first: %v", err)
			}
			got := make(chan error, 1)
			go func() { _, err := r.Recv(); got <- err }()
			select {
			case err := <-got:
				if !errors.Is(err, ErrFrame) {
					t.Fatalf("recv: %v; want ErrFrame", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the receive hangs")
			}
		})
	}
}

// testMemfd is a memfd of size bytes with seals.
func testMemfd(t *testing.T, size int, seals int) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("x", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// Copy frames of every size in the range, in an order that writes past
// what a reused memfd had been written before and then less again: each
// arrives whole, whether the receiver copies it out of its mapping or,
// for a memfd its sender could still shrink, with pread.
func TestCopyFramesOfChangingSizes(t *testing.T) {
	s, r := pair(t)
	ctx := context.Background()
	sizes := []int{InlineMax + 1, 3 << 20, 200 << 10, CopyMax, 1 << 20, CopyMax - 1, InlineMax + 4096}
	for i, n := range sizes {
		want := fill(n, byte(i+1))
		if err := s.Send(ctx, int64(i), want); err != nil {
			t.Fatal(err)
		}
		if m, err := r.Recv(); err != nil || !bytes.Equal(m.Data, want) {
			t.Fatalf("message %d of %d bytes: %v", i, n, err)
		}
	}
	r.maps.mu.Lock()
	mapped := len(r.maps.m)
	r.maps.mu.Unlock()
	if mapped != 1 {
		t.Fatalf("the receiver holds %d mappings of the sender's one memfd; want 1", mapped)
	}

	// A sender (another implementation) whose memfd is not sealed: read
	// with pread, nothing mapped.
	s2, r2 := pair(t)
	var fd int
	_ = s2.raw.Control(func(x uintptr) { fd = int(x) })
	f := testMemfd(t, 1<<20, 0)
	want := fill(1<<20, 9)
	if _, err := f.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendmsg(fd, rawHeader(kindCopy, 3, 1<<20), unix.UnixRights(int(f.Fd())), nil, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if m, err := r2.Recv(); err != nil || m.Tag != 3 || !bytes.Equal(m.Data, want) {
		t.Fatalf("an unsealed copy frame: %v", err)
	}
	if len(r2.maps.m) != 0 {
		t.Fatal("an unsealed memfd was mapped")
	}
}

// A hostile receiver: a credit that matches no memfd frame fails the
// sender's next send with ErrFrame rather than freeing a memfd still in
// flight.
func TestForgedCredit(t *testing.T) {
	s, r := pair(t)
	ctx := context.Background()
	if err := s.Send(ctx, 1, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	var fd int
	_ = r.raw.Control(func(x uintptr) { fd = int(x) })
	if err := unix.Sendmsg(fd, rawHeader(kindCredit, 0, 12345), nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(ctx, 2, make([]byte, 1<<20)); !errors.Is(err, ErrFrame) {
		t.Fatalf("send after a forged credit: %v; want ErrFrame", err)
	}
}

// A sender that closes with credits it has not read (it sent its last
// memfd frames and is done) resets its receiver, and Linux reports that
// reset once, before the frames still queued. The receiver gets every
// frame sent before the close, then io.EOF: the reset is not the end
// (a Go member's last echoes to a Python member were lost this way, and
// the other way round, whenever the receiver had not read them all yet
// when the sender exited).
func TestSenderClosedWithCreditsUnread(t *testing.T) {
	s, r := pair(t)
	ctx := context.Background()
	sent := [][]byte{fill(1<<20, 1), fill(1<<20, 2), fill(CopyMax+1, 3), fill(100, 4), fill(InlineMax+1, 5)}
	for i, b := range sent {
		if err := s.Send(ctx, int64(i), b); err != nil {
			t.Fatal(err)
		}
	}
	// The first frame read: its credit waits, unread, in the sender's
	// socket, which then closes.
	m, err := r.Recv()
	if err != nil || m.Tag != 0 || !bytes.Equal(m.Data, sent[0]) {
		t.Fatalf("message 0: tag %d, %d bytes, %v", m.Tag, len(m.Data), err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(sent); i++ {
		m, err := r.Recv()
		if err != nil {
			t.Fatalf("message %d of %d sent before the sender's close: %v", i, len(sent), err)
		}
		if m.Tag != int64(i) || !bytes.Equal(m.Data, sent[i]) {
			t.Fatalf("message %d: tag %d, %d bytes", i, m.Tag, len(m.Data))
		}
		if m.Mapped {
			_ = samenode.Unmap(m.Data)
		}
	}
	if _, err := r.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last message: %v; want io.EOF", err)
	}
}
