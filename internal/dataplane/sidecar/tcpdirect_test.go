package sidecar

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
)

// Direct channels across nodes (docs/messaging.md): a sender's sidecar
// opens a TCP connection on the receiver's data-plane port, which, once
// authenticated, becomes the channel between the two functions.

// attachTCP joins rank attached, taking TCP channels as the SDKs do.
func (p *msgPod) attachTCP(t *testing.T, session, group string, rank, size uint32) *localapi.MemberChannel {
	t.Helper()
	ctx, cancel := within(time.Minute)
	defer cancel()
	c := p.msgClient(t)
	c.TCPChannels = true
	mc, _, err := c.Attach(ctx, session, group, rank, size, false, "")
	if err != nil {
		t.Fatalf("attach %s rank %d: %v", group, rank, err)
	}
	t.Cleanup(func() { mc.Close() })
	return mc
}

func tcpOpenCounter(t *testing.T, result string) float64 {
	return counter(t, "ziptrail_messages_direct_tcp_opens_total", result)
}

// rawTCPOpen sends b after the magic (as its length-prefixed request
// unless raw) from local ("" any) to addr and returns the answer's status
// (0xff: no answer) and the connection, which is the channel after a
// direct answer.
func rawTCPOpen(t *testing.T, addr, local string, b []byte, raw bool) (byte, *net.TCPConn) {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := nc.(*net.TCPConn)
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	msg := append([]byte{}, directmsg.TCPMagic[:]...)
	if !raw {
		msg = binary.LittleEndian.AppendUint16(msg, uint16(len(b)))
	}
	if _, err := c.Write(append(msg, b...)); err != nil {
		return 0xff, c
	}
	var h [7]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0xff, c
	}
	reason := make([]byte, binary.LittleEndian.Uint16(h[5:]))
	if _, err := io.ReadFull(c, reason); err != nil || [4]byte(h[:4]) != directmsg.TCPMagic {
		t.Fatalf("a bad answer: %q, %v", h, err)
	}
	_ = c.SetDeadline(time.Time{})
	return h[4], c
}

// TestTCPChannelsFromTheOutside: two pods on different nodes get a TCP
// channel between their attached members (frames of every size pass from
// function to function, the end reads as io.EOF); opens sent straight to
// the data-plane port, as a hostile pod would, without a valid
// authenticator for the group, from another address than the sender
// rank's, for ranks not attached, not taking TCP channels, not run there
// or outside the group, malformed or oversized, are refused or answered
// nodirect, counted, and hand nobody a channel; a channel opened by hand
// that carries a descriptor-kind frame is dropped by its receiver.
func TestTCPChannelsFromTheOutside(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "ns-t", "pod-a")
	b := startMsgPod(t, op, "ns-t", "pod-b")
	other := startMsgPod(t, op, "ns-u", "pod-x")
	ma := a.attachTCP(t, "s1", "g", 0, 5)
	mb := b.attachTCP(t, "s1", "g", 1, 5)
	b.join(t, "s1", "g", 2, 5, false) // through gRPC: not attached
	b.attach(t, "s1", "g", 3, 5, false)
	a.attachTCP(t, "s1", "g", 4, 5) // in pod a, as rank 0
	waitLive(t, ma, 5)
	ctx, cancel := within(2 * time.Minute)
	defer cancel()

	// The sidecars' own open: rank 0 -> 1, a TCP socket at both ends.
	f, err := a.s.msgs.OpenDirect(ctx, "s1", "g", 0, 1, true)
	if err != nil {
		t.Fatalf("open 0 -> 1: %v", err)
	}
	send, err := directmsg.NewConn(f)
	if err != nil || !send.Stream() {
		t.Fatalf("the sending end: %v (stream %v)", err, send != nil && send.Stream())
	}
	p := nextPush(t, mb)
	if p.Direct == nil || p.From != 0 {
		t.Fatalf("rank 1's push: %+v", p)
	}
	recv, err := directmsg.NewConn(p.Direct)
	if err != nil || !recv.Stream() {
		t.Fatalf("the receiving end: %v", err)
	}
	sizes := []int{0, 1, 4096, directmsg.InlineMax + 1, directmsg.CopyMax + 1, 70 << 20}
	go func() {
		for i, n := range sizes {
			if err := send.Send(ctx, int64(i), bytes.Repeat([]byte{byte(i + 1)}, n)); err != nil {
				t.Errorf("send %d: %v", i, err)
				return
			}
		}
		send.Close()
	}()
	for i, n := range sizes {
		m, err := recv.Recv()
		if err != nil || m.Tag != int64(i) || len(m.Data) != n || m.Mapped || (n > 0 && (m.Data[0] != byte(i+1) || m.Data[n-1] != byte(i+1))) {
			t.Fatalf("message %d of %d bytes: tag %d, %d bytes, %v", i, n, m.Tag, len(m.Data), err)
		}
	}
	if _, err := recv.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the sender's close: %v, want io.EOF", err)
	}
	recv.Close()
	// Ranks in one pod keep to the sidecar; a member that did not ask
	// for TCP channels (an older SDK) gets none.
	if _, err := a.s.msgs.OpenDirect(ctx, "s1", "g", 0, 4, true); !errors.Is(err, messaging.ErrNoDirect) {
		t.Fatalf("open to a rank of the same pod: %v, want nodirect", err)
	}
	if _, err := a.s.msgs.OpenDirect(ctx, "s1", "g", 0, 3, true); !errors.Is(err, messaging.ErrNoDirect) {
		t.Fatalf("open to a member without TCP channels: %v, want nodirect", err)
	}
	if _, err := a.s.msgs.OpenDirect(ctx, "s1", "g", 0, 1, false); !errors.Is(err, messaging.ErrNoDirect) {
		t.Fatalf("open for a client without TCP channels: %v, want nodirect", err)
	}

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(b.s.cfg.DataplanePort))
	forged, good := groupAuths(t, a, other)
	refused0 := tcpOpenCounter(t, "refused_auth")
	for name, auth := range forged {
		if st, _ := rawTCPOpen(t, addr, "", validOpen(auth, "s1", "g", 0, 1), false); st != 2 {
			t.Fatalf("%s: status %d, want refused (2)", name, st)
		}
	}
	if n := tcpOpenCounter(t, "refused_auth"); n != refused0+5 {
		t.Errorf("refused_auth %v -> %v, want +5", refused0, n)
	}
	// A valid authenticator, but not from rank 0's address.
	badPeer0 := tcpOpenCounter(t, "bad_peer")
	if st, _ := rawTCPOpen(t, addr, "127.0.0.2", validOpen(good, "s1", "g", 0, 1), false); st != 2 {
		t.Fatalf("from another address: status %d, want refused (2)", st)
	}
	if n := tcpOpenCounter(t, "bad_peer"); n != badPeer0+1 {
		t.Errorf("bad_peer %v -> %v, want +1", badPeer0, n)
	}
	nodirect0 := tcpOpenCounter(t, "nodirect")
	for name, q := range map[string][]byte{
		"a rank not attached":             validOpen(good, "s1", "g", 0, 2),
		"a rank not taking TCP channels":  validOpen(good, "s1", "g", 0, 3),
		"a rank this pod does not run":    validOpen(good, "s1", "g", 4, 0),
		"a sender rank outside the group": validOpen(good, "s1", "g", 7, 1),
	} {
		st, _ := rawTCPOpen(t, addr, "", q, false)
		if name == "a sender rank outside the group" {
			if st != 2 { // not listed: its address is unknown
				t.Fatalf("%s: status %d, want refused (2)", name, st)
			}
			continue
		}
		if st != 1 {
			t.Fatalf("%s: status %d, want nodirect (1)", name, st)
		}
	}
	if n := tcpOpenCounter(t, "nodirect"); n != nodirect0+3 {
		t.Errorf("nodirect %v -> %v, want +3", nodirect0, n)
	}
	malformed0 := tcpOpenCounter(t, "refused_malformed")
	valid := validOpen(good, "s1", "g", 0, 1)
	for name, c := range map[string]struct {
		b   []byte
		raw bool
	}{
		"bad magic":        {b: append([]byte("XXXX"), valid[4:]...)},
		"trailing bytes":   {b: append(append([]byte{}, valid...), 1, 2)},
		"lengths past end": {b: []byte("ZTN1\xff\xff")},
		"oversized":        {b: []byte{0xff, 0xff}, raw: true},
	} {
		if st, _ := rawTCPOpen(t, addr, "", c.b, c.raw); st != 2 {
			t.Fatalf("%s: status %d, want refused (2)", name, st)
		}
	}
	// Half a request, then the end: no answer.
	half, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = half.Write(append(directmsg.TCPMagic[:], 0x40, 0, 'Z'))
	_ = half.(*net.TCPConn).CloseWrite()
	_ = half.SetReadDeadline(time.Now().Add(time.Minute))
	if n, err := half.Read(make([]byte, 16)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("half a request: %d bytes, %v; want no answer", n, err)
	}
	half.Close()
	// Each refusal is counted before the sidecar answers or closes, so
	// the answers read above (and the end of the half request) follow it.
	if n := tcpOpenCounter(t, "refused_malformed"); n != malformed0+5 {
		t.Errorf("refused_malformed %v -> %v, want +5", malformed0, n)
	}
	// Nothing reached rank 1's member channel meanwhile, and the port
	// still answers a valid open: a hand-made channel whose frames are a
	// hostile peer's (a memfd frame cannot cross TCP) is dropped by the
	// receiver with ErrFrame, after the valid frame before it.
	st, c := rawTCPOpen(t, addr, "", valid, false)
	if st != 0 {
		t.Fatalf("a valid open after the attacks: status %d", st)
	}
	p = nextPush(t, mb)
	if p.Direct == nil || p.From != 0 {
		t.Fatalf("rank 1's push after the attacks: %+v (the attacks must not have pushed anything)", p)
	}
	recv, err = directmsg.NewConn(p.Direct)
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	frame := func(kind byte, tag int64, body []byte) []byte {
		h := []byte("ZTD1")
		h = append(h, kind)
		h = binary.LittleEndian.AppendUint64(h, uint64(tag))
		h = binary.LittleEndian.AppendUint64(h, uint64(len(body)))
		return append(h, body...)
	}
	if _, err := c.Write(append(frame(1, 7, []byte("hello")), frame(2, 8, nil)...)); err != nil {
		t.Fatal(err)
	}
	if m, err := recv.Recv(); err != nil || m.Tag != 7 || string(m.Data) != "hello" {
		t.Fatalf("the valid frame: %v", err)
	}
	if _, err := recv.Recv(); !errors.Is(err, directmsg.ErrFrame) {
		t.Fatalf("a memfd frame over TCP: %v, want ErrFrame", err)
	}
	// A frame announcing more than a message may hold.
	st, c = rawTCPOpen(t, addr, "", valid, false)
	if st != 0 {
		t.Fatalf("another valid open: status %d", st)
	}
	p = nextPush(t, mb)
	recv2, err := directmsg.NewConn(p.Direct)
	if err != nil {
		t.Fatal(err)
	}
	defer recv2.Close()
	h := frame(1, 1, nil)
	binary.LittleEndian.PutUint64(h[13:], directmsg.MaxMessage+1)
	if _, err := c.Write(h); err != nil {
		t.Fatal(err)
	}
	if _, err := recv2.Recv(); !errors.Is(err, directmsg.ErrFrame) {
		t.Fatalf("an oversized frame: %v, want ErrFrame", err)
	}
}
