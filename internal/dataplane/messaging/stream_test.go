package messaging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A dial to a peer that does not answer (its node is gone: SYNs vanish)
// holds back no delivery to another peer: one over an open stream goes
// while the dial still waits. The order is what the test checks: the
// healthy delivery ends while the dead dial is under way (the kernel
// lists its SYN_SENT socket before and after).
func TestDeadDialHoldsNoOtherPeer(t *testing.T) {
	d := newTestDir(t)
	rcv, snd := d.newPod(t, nil), d.newPod(t, nil)
	rcv.join(t, 1, 2)
	snd.join(t, 0, 2)
	auth := snd.auth(t)
	s := &snd.r.streams
	msg := func(seq uint64) Message {
		return Message{Session: "s1", Group: "g", From: 0, To: 1, Seq: seq, Data: []byte("hello")}
	}
	bg, cancelAll := context.WithTimeout(context.Background(), time.Minute)
	defer cancelAll()
	// The healthy peer's stream is open.
	if st, err := s.Deliver(bg, rcv.addr, auth, msg(1), nil); err != nil || st != Queued {
		t.Fatalf("first delivery: %v, %v", st, err)
	}

	dead, port := blackhole(t)
	deadCtx, cancelDead := context.WithTimeout(bg, 5*time.Second)
	defer cancelDead()
	deadDone := make(chan error, 1)
	go func() {
		_, err := s.Deliver(deadCtx, dead, auth, msg(100), nil)
		deadDone <- err
	}()
	for synSent(t, port) == 0 {
		select {
		case err := <-deadDone:
			t.Fatalf("the dial to the blackhole ended (%v): no blackhole on this host", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	// A second delivery to the dead peer waits for the same dial, and
	// leaves when its own context ends (not when the dial does).
	secondCtx, cancelSecond := context.WithCancel(bg)
	secondDone := make(chan error, 1)
	go func() {
		_, err := s.Deliver(secondCtx, dead, auth, msg(101), nil)
		secondDone <- err
	}()

	healthy := make(chan error, 1)
	go func() {
		st, err := s.Deliver(bg, rcv.addr, auth, msg(2), nil)
		if err == nil && st != Queued {
			err = fmt.Errorf("status %d, not queued", st)
		}
		healthy <- err
	}()
	select {
	case err := <-healthy:
		if err != nil {
			t.Fatalf("delivery to the healthy peer: %v", err)
		}
	case err := <-deadDone:
		t.Fatalf("the dial to the dead peer ended (%v) before the delivery to the healthy peer over its open stream", err)
	}
	if n := synSent(t, port); n != 1 {
		t.Errorf("%d dials under way to the dead peer, want 1 (one dial per address)", n)
	}
	cancelSecond()
	select {
	case err := <-secondDone:
		if !errors.Is(err, context.Canceled) && !errors.Is(err, ErrUnreachable) {
			t.Errorf("the second delivery to the dead peer: %v", err)
		}
	case err := <-deadDone:
		t.Fatalf("the dead dial ended (%v) before the second delivery, whose context was cancelled, returned", err)
	}
	select {
	case <-deadDone:
		t.Fatal("the dial to the dead peer ended before its context")
	default:
	}
	cancelDead()
	if err := <-deadDone; !errors.Is(err, ErrUnreachable) && !errors.Is(err, context.Canceled) {
		t.Fatalf("the dead delivery: %v", err)
	}
	// The healthy peer got both messages.
	for _, seq := range []uint64{1, 2} {
		m, err := rcv.r.Recv(bg, "s1", "g", 1, Filter{AnySource: true, AnyTag: true})
		if err != nil || m.Seq != seq {
			t.Fatalf("receive: %v, seq %d, want %d", err, m.Seq, seq)
		}
	}
}

// One failed dial fails every delivery that waited for it; the next
// delivery dials again.
func TestDialFailureReachesItsWaiters(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused
	var s Streams
	defer s.Close()
	errs := make(chan error, 8)
	for range cap(errs) {
		go func() {
			_, err := s.Deliver(context.Background(), addr, "", Message{Data: []byte("x")}, nil)
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; !errors.Is(err, ErrUnreachable) {
			t.Fatalf("delivery to a refusing address: %v, want ErrUnreachable", err)
		}
	}
}

// floodSends sends n messages of size bytes from rank 0 to rank 1 as the
// function socket's fast path does (SendFunc, no goroutine per send),
// from this one goroutine; results come to done.
func floodSends(r *Router, n, size int, timeout time.Duration, done chan<- error) {
	for i := range n {
		data := bytes.Repeat([]byte{byte(i)}, size)
		r.SendFunc(Outgoing{Session: "s1", Group: "g", From: 0, To: 1, Tag: int64(i), Data: data}, timeout, func(_ bool, err error) { done <- err })
	}
}

// floodBlocked: floodSends' goroutine waits in the network poller (its
// stream's socket is full).
func floodBlocked() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "messaging.floodSends") && strings.Contains(g, "[IO wait") {
			return true
		}
	}
	return false
}

// A receiver's full inbox holds its sender back: 400 messages of 60 KiB
// sent at once to an inbox capped at 1 MiB that nobody reads. The
// receiving sidecar stops reading the stream, so the bytes it queued
// stay under the cap and one message, no goroutine waits per message,
// the sender's sends wait for room (one with a deadline fails with
// ErrTimeout), other peers' streams go on; once the receiver reads,
// every message comes, in order.
func TestFullInboxHoldsTheSender(t *testing.T) {
	const (
		capBytes = 1 << 20
		size     = 60 << 10
		n        = 400
	)
	d := newTestDir(t)
	rcv := d.newPod(t, func(c *Config) { c.QueueBytes = capBytes })
	snd, other := d.newPod(t, nil), d.newPod(t, nil)
	snd.join(t, 0, 3)
	rcv.join(t, 1, 3)
	other.join(t, 2, 3)
	snd.waitJoined(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The stream to rcv is open.
	if _, err := snd.r.Send(ctx, Outgoing{Session: "s1", Group: "g", From: 0, To: 1, Tag: -1, Data: []byte("open")}); err != nil {
		t.Fatal(err)
	}
	if _, err := rcv.r.Recv(ctx, "s1", "g", 1, Filter{AnySource: true, Tag: -1}); err != nil {
		t.Fatal(err)
	}

	before := runtime.NumGoroutine()
	done := make(chan error, n)
	flooded := make(chan struct{})
	go func() {
		floodSends(snd.r, n, size, 0, done)
		close(flooded)
	}()
	// Until the flood is held back (the sender's socket full while the
	// inbox is at its cap) or over: the inbox's high-water mark.
	var most int64
	finished := false
	for end := time.Now().Add(time.Minute); ; {
		b := rcv.inboxBytes(1)
		most = max(most, b)
		select {
		case <-flooded:
			finished = true
		default:
		}
		if finished || (b >= capBytes && floodBlocked()) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("after a minute the flood is neither over nor held back (inbox %d bytes)", b)
		}
		time.Sleep(2 * time.Millisecond)
	}
	grown := runtime.NumGoroutine() - before
	t.Logf("inbox high-water mark %d bytes (cap %d), goroutines +%d, flood finished before any read: %v", most, capBytes, grown, finished)
	if most > capBytes+size {
		t.Errorf("the inbox held %d bytes: over its cap of %d and one message", most, capBytes)
	}
	if grown > 20 {
		t.Errorf("%d more goroutines while %d messages wait", grown, n)
	}
	if finished {
		t.Errorf("all %d messages of %d bytes were taken by a receiver whose %d-byte inbox nobody reads", n, size, capBytes)
	}

	// Meanwhile a send with a deadline times out, and another peer's
	// stream goes on.
	tctx, tcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := snd.r.Send(tctx, Outgoing{Session: "s1", Group: "g", From: 0, To: 1, Tag: -2, Data: []byte("late")})
	tcancel()
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("a send with a deadline to the held receiver: %v, want ErrTimeout", err)
	}
	if _, err := snd.r.Send(ctx, Outgoing{Session: "s1", Group: "g", From: 0, To: 2, Tag: 5, Data: []byte("elsewhere")}); err != nil {
		t.Errorf("a send to another pod while rank 1's is held: %v", err)
	}
	if m, err := other.r.Recv(ctx, "s1", "g", 2, Filter{AnySource: true, AnyTag: true}); err != nil || string(m.Data) != "elsewhere" {
		t.Errorf("receive at the other pod: %q, %v", m.Data, err)
	}

	// The receiver reads: every message, in order, and the inbox stays
	// within its cap and one message. The send that timed out may have
	// arrived or not, as the package says of any send that timed out: its
	// frame may have gone into the socket before its answer was due (the
	// sockets' buffers are not fixed: TCP may take a little more after the
	// inbox stopped the reader, which lets the held writer finish and the
	// late send write; seen once in CI on a loaded machine). Once at most.
	late := 0
	for i := 0; i < n; {
		m, err := rcv.r.Recv(ctx, "s1", "g", 1, Filter{AnySource: true, AnyTag: true})
		if err != nil {
			t.Fatalf("receive %d: %v", i, err)
		}
		if m.Tag == -2 {
			late++
			continue
		}
		if m.Tag != int64(i) || len(m.Data) != size || m.Data[0] != byte(i) || m.Data[size-1] != byte(i) {
			t.Fatalf("message %d: tag %d, %d bytes", i, m.Tag, len(m.Data))
		}
		if b := rcv.inboxBytes(1); b > capBytes+size {
			t.Fatalf("after receive %d the inbox holds %d bytes", i, b)
		}
		i++
	}
	<-flooded
	for i := range n {
		if err := <-done; err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	tctx, tcancel = context.WithTimeout(ctx, 100*time.Millisecond)
	defer tcancel()
	if _, err := rcv.r.Recv(tctx, "s1", "g", 1, Filter{AnySource: true, Tag: -2}); err == nil {
		late++
	}
	if late > 1 {
		t.Errorf("the send that timed out arrived %d times", late)
	}
}

// Sends with a deadline to a receiver that reads nothing end, each
// queued or with ErrTimeout, also the one whose frame the deadline cut
// (its stream is dropped, the sends behind it fail over to a new one).
// Once the receiver reads, it gets every message whose send succeeded,
// once, in order (a send that timed out may have arrived or not, as
// ever: its outcome is unknown).
func TestHeldSendsTimeOut(t *testing.T) {
	const (
		capBytes = 1 << 20
		size     = 60 << 10
		n        = 200
	)
	d := newTestDir(t)
	rcv := d.newPod(t, func(c *Config) { c.QueueBytes = capBytes })
	snd := d.newPod(t, nil)
	snd.join(t, 0, 2)
	rcv.join(t, 1, 2)
	snd.waitJoined(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := snd.r.Send(ctx, Outgoing{Session: "s1", Group: "g", From: 0, To: 1, Tag: -1, Data: []byte("open")}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, n)
	ok := make([]bool, n)
	go func() {
		for i := range n {
			data := bytes.Repeat([]byte{byte(i)}, size)
			snd.r.SendFunc(Outgoing{Session: "s1", Group: "g", From: 0, To: 1, Tag: int64(i), Data: data}, 300*time.Millisecond, func(_ bool, err error) {
				ok[i] = err == nil
				done <- err
			})
		}
	}()
	queued, timedOut := 0, 0
	for range n {
		switch err := <-done; {
		case err == nil:
			queued++
		case errors.Is(err, ErrTimeout):
			timedOut++
		default:
			t.Fatalf("send: %v", err)
		}
	}
	t.Logf("%d queued, %d timed out; %d streams to the receiver (the cut ones dropped)", queued, timedOut, rcv.accepts.Load())
	if timedOut == 0 {
		t.Fatalf("all %d sends to a receiver that reads nothing were queued", n)
	}
	seen := map[int64]bool{}
	lastOK, got := int64(-1), 0
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		m, err := rcv.r.Recv(rctx, "s1", "g", 1, Filter{AnySource: true, AnyTag: true})
		rcancel()
		if errors.Is(err, ErrTimeout) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if seen[m.Tag] {
			t.Fatalf("message %d received twice", m.Tag)
		}
		seen[m.Tag] = true
		if len(m.Data) != size || m.Data[0] != byte(m.Tag) || m.Data[size-1] != byte(m.Tag) {
			t.Fatalf("message %d: %d bytes, wrong content", m.Tag, len(m.Data))
		}
		if ok[m.Tag] {
			if m.Tag < lastOK {
				t.Fatalf("queued message %d after queued message %d", m.Tag, lastOK)
			}
			lastOK = m.Tag
			got++
		}
	}
	if got != queued {
		t.Fatalf("%d of the %d queued messages received", got, queued)
	}
}

// The data-plane port's message streams: a peer that sends the magic and
// then nothing is closed after the handshake deadline (shortened here);
// a stream past the cap on concurrent streams is refused (closed at
// once, counted) while an established stream still delivers.
func TestMessageStreamLimits(t *testing.T) {
	pods := func(t *testing.T) (rcv, snd *testPod, send func(int64)) {
		d := newTestDir(t)
		rcv, snd = d.newPod(t, nil), d.newPod(t, nil)
		rcv.join(t, 1, 2)
		snd.join(t, 0, 2)
		snd.waitJoined(t, 2)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		return rcv, snd, func(tag int64) {
			t.Helper()
			if _, err := snd.r.Send(ctx, Outgoing{Session: "s1", Group: "g", From: 0, To: 1, Tag: tag, Data: []byte("x")}); err != nil {
				t.Fatalf("send %d: %v", tag, err)
			}
			if m, err := rcv.r.Recv(ctx, "s1", "g", 1, Filter{AnySource: true, AnyTag: true}); err != nil || m.Tag != tag {
				t.Fatalf("receive %d: tag %d, %v", tag, m.Tag, err)
			}
		}
	}
	raw := func(t *testing.T, addr string) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(StreamMagic[:]); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// closed: the receiver closes c (30 s is a bound, not a timed
	// assertion: a receiver that never does fails the test rather than
	// hang it).
	closed := func(c net.Conn) error {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := c.Read(make([]byte, 1))
		if errors.Is(err, io.EOF) || isReset(err) {
			return nil
		}
		return fmt.Errorf("not closed by the receiver (%v)", err)
	}

	t.Run("magic then nothing", func(t *testing.T) {
		t.Setenv("ZIPTRAIL_MSG_STREAM_HANDSHAKE_TIMEOUT", "300ms")
		rcv, _, send := pods(t)
		if err := closed(raw(t, rcv.addr)); err != nil {
			t.Fatalf("a stream that sent its magic and then nothing: %v", err)
		}
		// A stream that passed its handshake stays open, idle as long as
		// it likes: a send after the deadline uses it again.
		send(1)
		time.Sleep(600 * time.Millisecond)
		send(2)
		if n := rcv.accepts.Load(); n != 2 {
			t.Fatalf("%d connections to the receiver, want 2 (the stalled one, then one stream for both sends)", n)
		}
	})
	t.Run("over the cap", func(t *testing.T) {
		t.Setenv("ZIPTRAIL_MSG_STREAM_HANDSHAKE_TIMEOUT", "1m")
		t.Setenv("ZIPTRAIL_MSG_STREAMS_MAX", "2")
		rcv, _, send := pods(t)
		refused := metric(t, "ziptrail_messages_streams_refused_total", "reason", "limit")
		send(3) // the sender's stream: 1 of 2
		// Two more: one fits, the other is refused (whichever the
		// receiver took second).
		ends := make(chan error, 2)
		for range 2 {
			c := raw(t, rcv.addr)
			go func() { ends <- closed(c) }()
		}
		if err := <-ends; err != nil {
			t.Fatalf("of two streams over one free place: %v", err)
		}
		if got := metric(t, "ziptrail_messages_streams_refused_total", "reason", "limit"); got != refused+1 {
			t.Errorf("refused streams counted %v, want %v", got, refused+1)
		}
		send(4) // the established stream still delivers
	})
	t.Run("over the cap from one address", func(t *testing.T) {
		t.Setenv("ZIPTRAIL_MSG_STREAM_HANDSHAKE_TIMEOUT", "1m")
		t.Setenv("ZIPTRAIL_MSG_STREAMS_PER_PEER", "3")
		rcv, _, send := pods(t)
		refused := metric(t, "ziptrail_messages_streams_refused_total", "reason", "peer_limit")
		send(5) // the sender's stream: 1 of 3 from 127.0.0.1
		// A pod that opens streams and sends nothing holds 2 more places;
		// the next is refused, whatever the global cap.
		ends := make(chan error, 3)
		for range 3 {
			c := raw(t, rcv.addr)
			go func() { ends <- closed(c) }()
		}
		if err := <-ends; err != nil {
			t.Fatalf("of three streams over two free places of one address: %v", err)
		}
		if got := metric(t, "ziptrail_messages_streams_refused_total", "reason", "peer_limit"); got != refused+1 {
			t.Errorf("refused streams counted %v, want %v", got, refused+1)
		}
		send(6) // the established stream still delivers
	})
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "reset")
}

// panicFile is a Config.NewFile that panics, as a bug reached by a peer's
// bytes would.
func panicFile(int64) (File, error) { panic("a bug reached by a peer's message") }

// A panic in a stream's reader (here the receiving pod's NewFile, which
// a large message reaches) ends that stream, is counted and logged, and
// the sidecar serves on: the next stream delivers.
func TestStreamReaderPanicIsContained(t *testing.T) {
	d := newTestDir(t)
	rcv := d.newPod(t, func(c *Config) { c.NewFile = panicFile; c.InlineMax = 1 << 10 })
	snd := d.newPod(t, nil)
	rcv.join(t, 1, 2)
	snd.join(t, 0, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := metric(t, "ziptrail_messages_panics_total", "where", "stream")
	s := &snd.r.streams
	big := Message{Session: "s1", Group: "g", From: 0, To: 1, Seq: 1, Data: make([]byte, 4<<10)}
	if st, err := s.Deliver(ctx, rcv.addr, snd.auth(t), big, nil); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a message whose reading panics: status %d, %v; want ErrUnreachable (the stream closed)", st, err)
	}
	if got := metric(t, "ziptrail_messages_panics_total", "where", "stream"); got != before+1 {
		t.Errorf("panics counted: %v, want %v", got, before+1)
	}
	small := Message{Session: "s1", Group: "g", From: 0, To: 1, Seq: 2, Data: []byte("still here")}
	if st, err := s.Deliver(ctx, rcv.addr, snd.auth(t), small, nil); err != nil || st != Queued {
		t.Fatalf("after the panic: %d, %v", st, err)
	}
}

// Bodies from a file (sendfile) and large ones kept in memory (no object
// directory at the receiver: read as their bytes come) arrive whole.
func TestDeliverFileBodies(t *testing.T) {
	d := newTestDir(t)
	rcv, snd := d.newPod(t, nil), d.newPod(t, nil)
	rcv.join(t, 1, 2)
	snd.join(t, 0, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, size := range []int{0, 100 << 10, 3 << 20, memPrealloc + 5<<20} {
		data := bytes.Repeat([]byte{byte(i + 1), 2, 3}, size/3+1)[:size]
		f, err := os.CreateTemp(t.TempDir(), "msg")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		m := Message{Session: "s1", Group: "g", From: 0, To: 1, Seq: uint64(i + 1), Size: uint64(size)}
		if st, err := snd.r.streams.Deliver(ctx, rcv.addr, snd.auth(t), m, f); err != nil || st != Queued {
			t.Fatalf("%d bytes from a file: %d, %v", size, st, err)
		}
		f.Close()
		got, err := rcv.r.Recv(ctx, "s1", "g", 1, Filter{AnySource: true, AnyTag: true})
		if err != nil || !bytes.Equal(got.Data, data) {
			t.Fatalf("%d bytes from a file: received %d bytes, %v", size, len(got.Data), err)
		}
	}
	// A file shorter than the message says breaks the stream (its frame
	// is cut), and the next delivery goes on a new one.
	f, err := os.CreateTemp(t.TempDir(), "short")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write([]byte("short"))
	m := Message{Session: "s1", Group: "g", From: 0, To: 1, Seq: 10, Size: 1 << 20}
	if _, err := snd.r.streams.Deliver(ctx, rcv.addr, snd.auth(t), m, f); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a short file: %v, want ErrUnreachable", err)
	}
	m = Message{Session: "s1", Group: "g", From: 0, To: 1, Seq: 11, Data: []byte("next")}
	if st, err := snd.r.streams.Deliver(ctx, rcv.addr, snd.auth(t), m, nil); err != nil || st != Queued {
		t.Fatalf("after a cut frame: %d, %v", st, err)
	}
}
