package sidecar

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
	"github.com/ziptrail/ziptrail/internal/nodedir"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// The same-node direct channels (docs/messaging.md): real sidecars on the
// operator's real control server, sharing a node directory per node.

// tokenPodUID is the pod UID the API server bound a token to: the UID
// the directory puts in views, which the sidecar's node socket must be
// named after.
func tokenPodUID(t testing.TB, tokenFile string) string {
	t.Helper()
	uid, err := servers.TokenPodUID(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	return uid
}

// nodeDirs hands out one node directory per node name.
func nodeDirs(t testing.TB) func(node string) string {
	dirs := map[string]string{}
	return func(node string) string {
		if d, ok := dirs[node]; ok {
			return d
		}
		d, err := os.MkdirTemp("", "zn") // short: socket paths are at most 107 bytes
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(d) })
		if err := nodedir.Prepare(d); err != nil {
			t.Fatal(err)
		}
		dirs[node] = d
		return d
	}
}

// onNode starts a pod's sidecar on node, with the node's directory.
func onNode(t testing.TB, dirs func(string) string, node string) func(*Config) {
	return func(c *Config) {
		c.SameNode = SameNodeConfig{Dir: dirs(node), Node: node, PodUID: tokenPodUID(t, c.TokenFile)}
	}
}

func (p *msgPod) msgClient(t testing.TB) *localapi.MessageClient {
	c := localapi.NewMessageClient(localapi.MessageSocket(p.s.cfg.APISocket))
	t.Cleanup(func() { c.Close() })
	return c
}

// attach joins rank attached and returns its member channel.
func (p *msgPod) attach(t *testing.T, session, group string, rank, size uint32, mailbox bool) *localapi.MemberChannel {
	t.Helper()
	ctx, cancel := within(time.Minute)
	defer cancel()
	mc, _, err := p.msgClient(t).Attach(ctx, session, group, rank, size, mailbox, "")
	if err != nil {
		t.Fatalf("attach %s rank %d: %v", group, rank, err)
	}
	t.Cleanup(func() { mc.Close() })
	return mc
}

// nextPush reads pushes until one that is not a view.
func nextPush(t *testing.T, mc *localapi.MemberChannel) localapi.Push {
	t.Helper()
	for {
		p, err := mc.Next()
		if err != nil {
			t.Fatalf("member channel: %v", err)
		}
		if p.View == nil {
			return p
		}
	}
}

// waitLive waits until the member channel's view lists n live ranks.
func waitLive(t *testing.T, mc *localapi.MemberChannel, n int) {
	t.Helper()
	for {
		p, err := mc.Next()
		if err != nil {
			t.Fatalf("member channel: %v", err)
		}
		if p.View == nil {
			t.Fatalf("a push before the view: %+v", p)
		}
		if len(p.View.Live) == n {
			return
		}
	}
}

// TestDirectChannels: two pods on one node get a direct channel (the
// receiver's end comes on its member channel, frames pass from function
// to function); a peer on another node, a mailbox group and a rank that
// did not attach get nodirect; sidecar-path messages come on the member
// channel in order.
func TestDirectChannels(t *testing.T) {
	op := messagingEnv(t)
	dirs := nodeDirs(t)
	a := startMsgPod(t, op, "ns-d", "pod-a", onNode(t, dirs, "node-a"))
	b := startMsgPod(t, op, "ns-d", "pod-b", onNode(t, dirs, "node-a"))
	far := startMsgPod(t, op, "ns-d", "pod-c", onNode(t, dirs, "node-b"))
	ma := a.attach(t, "s1", "g", 0, 4, false)
	mb := b.attach(t, "s1", "g", 1, 4, false)
	mfar := far.attach(t, "s1", "g", 2, 4, false)
	b.join(t, "s1", "g", 3, 4, false) // through gRPC: not attached
	waitLive(t, ma, 4)
	waitLive(t, mb, 4)
	waitLive(t, mfar, 4)
	ctx, cancel := within(time.Minute)
	defer cancel()

	sender, recv := openDirect(ctx, t, a, mb)
	defer sender.Close()
	defer recv.Close()
	big := bytes.Repeat([]byte("direct"), 100_000) // a memfd frame
	for i, data := range [][]byte{[]byte("hello"), big} {
		if err := sender.Send(ctx, int64(i), data); err != nil {
			t.Fatal(err)
		}
		m, err := recv.Recv()
		if err != nil || m.Tag != int64(i) || !bytes.Equal(m.Data, data) {
			t.Fatalf("frame %d: tag %d, %d bytes, %v", i, m.Tag, len(m.Data), err)
		}
		if m.Mapped {
			_ = samenode.Unmap(m.Data)
		}
	}

	for _, c := range []struct {
		name     string
		from, to uint32
		cl       *localapi.MessageClient
	}{
		{"a peer on another node", 0, 2, a.msgClient(t)},
		{"a same-node rank that did not attach", 0, 3, a.msgClient(t)},
		{"to a peer on another node (from it)", 2, 0, far.msgClient(t)},
	} {
		f, err := c.cl.Open(ctx, "s1", "g", c.from, c.to)
		if err != nil || f != nil {
			t.Fatalf("%s: %v, %v; want nodirect", c.name, f, err)
		}
	}
	// A rank this pod does not run cannot open.
	var me *localapi.MessageError
	if _, err := b.msgClient(t).Open(ctx, "s1", "g", 0, 1); !errors.As(err, &me) || me.Reason != localapi.ReasonGroupClosed {
		t.Fatalf("open as a rank of another pod: %v, want %s", err, localapi.ReasonGroupClosed)
	}

	// Sidecar-path messages (from the other node) come on the member
	// channel, in order, small and large.
	for i := range 20 {
		data := []byte{byte(i)}
		if i == 10 {
			data = bytes.Repeat([]byte{9}, 200<<10) // a file at the receiver
		}
		if _, err := far.msgClient(t).Send(ctx, "s1", "g", 2, 0, int64(i), data, ""); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		p := nextPush(t, ma)
		if p.Msg == nil || p.Msg.From != 2 || p.Msg.Tag != int64(i) {
			t.Fatalf("push %d: %+v", i, p)
		}
		if p.Msg.Path != "" {
			data, err := os.ReadFile(p.Msg.Path)
			if err != nil || len(data) != 200<<10 {
				t.Fatalf("large message: %d bytes, %v", len(data), err)
			}
			_ = os.Remove(p.Msg.Path)
		}
	}

	// A mailbox group never goes direct.
	a.attach(t, "s1", "mb", 0, 2, true)
	b.attach(t, "s1", "mb", 1, 2, true)
	for {
		v, err := a.s.msgs.Members(ctx, "s1", "mb", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Members) == 2 {
			break
		}
		_, _ = a.s.msgs.Members(ctx, "s1", "mb", v.Epoch)
	}
	if f, err := a.msgClient(t).Open(ctx, "s1", "mb", 0, 1); err != nil || f != nil {
		t.Fatalf("a mailbox group: %v, %v; want nodirect", f, err)
	}
}

// openCounter reads ziptrail_messages_direct_opens_total{result}.
func openCounter(t *testing.T, result string) float64 {
	return counter(t, "ziptrail_messages_direct_opens_total", result)
}

func openFDCount(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestDirectNodeSocketRefusesAttackers: requests straight to a pod's node
// messaging socket without a valid authenticator for that group, for a
// rank not attached, malformed, oversized or carrying descriptors are
// refused, counted, and leave no descriptor behind.
func TestDirectNodeSocketRefusesAttackers(t *testing.T) {
	op := messagingEnv(t)
	dirs := nodeDirs(t)
	a := startMsgPod(t, op, "ns-e", "pod-a", onNode(t, dirs, "node-a"))
	b := startMsgPod(t, op, "ns-e", "pod-b", onNode(t, dirs, "node-a"))
	other := startMsgPod(t, op, "ns-f", "pod-x", onNode(t, dirs, "node-a"))
	ma := a.attach(t, "s1", "g", 0, 3, false)
	b.attach(t, "s1", "g", 1, 3, false)
	b.join(t, "s1", "g", 2, 3, false) // not attached
	waitLive(t, ma, 3)
	dir, uid := b.s.cfg.SameNode.Dir, b.s.cfg.SameNode.PodUID
	forged, good := groupAuths(t, a, other)
	ctx, cancel := within(time.Minute)
	defer cancel()
	fds0 := openFDCount(t)
	refused0 := openCounter(t, "refused_auth")
	for name, auth := range forged {
		f, err := directmsg.Open(ctx, dir, uid, directmsg.OpenRequest{Auth: auth, Session: "s1", Group: "g", From: 0, To: 1}, messaging.ErrNoDirect)
		if f != nil || !errors.Is(err, directmsg.ErrRefused) {
			t.Fatalf("%s: %v, %v; want refused", name, f, err)
		}
	}
	if n := openCounter(t, "refused_auth"); n != refused0+5 {
		t.Errorf("refused_auth %v -> %v, want +5", refused0, n)
	}
	for name, q := range map[string]directmsg.OpenRequest{
		"a rank not attached":          {Auth: good, Session: "s1", Group: "g", From: 0, To: 2},
		"a rank this pod does not run": {Auth: good, Session: "s1", Group: "g", From: 1, To: 0},
		"a rank outside the group":     {Auth: good, Session: "s1", Group: "g", From: 7, To: 1},
	} {
		f, err := directmsg.Open(ctx, dir, uid, q, messaging.ErrNoDirect)
		if f != nil || !errors.Is(err, messaging.ErrNoDirect) || errors.Is(err, directmsg.ErrRefused) {
			t.Fatalf("%s: %v, %v; want nodirect", name, f, err)
		}
	}
	// Raw requests: malformed, oversized, with descriptors.
	path, _ := directmsg.NodeSocket(dir, uid)
	valid := validOpen(good, "s1", "g", 0, 1)
	memfd, err := samenode.NewSealed("x", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	defer memfd.Close()
	malformed0, fdsRefused0 := openCounter(t, "refused_malformed"), openCounter(t, "refused_fds")
	for name, c := range map[string]struct {
		b   []byte
		oob []byte
	}{
		"bad magic":         {b: append([]byte("XXXX"), valid[4:]...)},
		"truncated":         {b: valid[:len(valid)-3]},
		"trailing bytes":    {b: append(append([]byte{}, valid...), 1, 2)},
		"oversized":         {b: append(append([]byte{}, valid...), make([]byte, 20<<10)...)},
		"lengths past end":  {b: append([]byte("ZTN1"), 0xff, 0xff)},
		"with a descriptor": {b: valid, oob: unix.UnixRights(int(memfd.Fd()))},
		"with two":          {b: valid, oob: unix.UnixRights(int(memfd.Fd()), int(memfd.Fd()))},
	} {
		st, fds := rawOpen(t, path, c.b, c.oob)
		if st != 2 || fds != 0 {
			t.Fatalf("%s: status %d with %d descriptors, want refused (2) without", name, st, fds)
		}
	}
	if m, f := openCounter(t, "refused_malformed"), openCounter(t, "refused_fds"); m != malformed0+5 || f != fdsRefused0+2 {
		t.Errorf("refused_malformed %v -> %v (want +5), refused_fds %v -> %v (want +2)", malformed0, m, fdsRefused0, f)
	}
	// The sidecar serves on, and holds no descriptor it was sent.
	f, err := directmsg.Open(ctx, dir, uid, directmsg.OpenRequest{Auth: good, Session: "s1", Group: "g", From: 0, To: 1}, messaging.ErrNoDirect)
	if err != nil {
		t.Fatalf("a valid open after the attacks: %v", err)
	}
	f.Close()
	memfd.Close()
	// (The valid open's other end went to rank 1's member channel: in
	// flight in its socket, in no process's table until read.)
	deadline := time.Now().Add(time.Minute)
	for openFDCount(t) > fds0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := openFDCount(t); n > fds0 {
		t.Fatalf("%d descriptors open after the attacks, %d before", n, fds0)
	}
}

// groupAuths are the authenticators an attacker could present for group g
// of session s1 in a's namespace, none valid (none, garbage, forged,
// another namespace's key: other's, another group's), and a valid one,
// as a's sidecar seals it.
func groupAuths(t *testing.T, a, other *msgPod) (forged map[string]string, good string) {
	t.Helper()
	seal := func(kr *ref.Keyring, key string) string {
		tok, err := kr.Seal(ref.Record{Addr: a.s.addr(), Key: key, Expires: time.Now().Add(time.Minute), Reads: 1})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	own, foreign := a.s.keys.Load(), other.s.keys.Load()
	forger, err := ref.NewKeyring(a.ns, map[string][]byte{"k1": bytes.Repeat([]byte{0x42}, 32)}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"no authenticator":        "",
		"garbage":                 "not-a-token",
		"forged":                  seal(forger, "msg\x00s1\x00g"),
		"another namespace's key": seal(foreign, "msg\x00s1\x00g"),
		"another group's":         seal(own, "msg\x00s1\x00other"),
	}, seal(own, "msg\x00s1\x00g")
}

func validOpen(auth, session, group string, from, to uint32) []byte {
	b := []byte("ZTN1")
	for _, s := range []string{auth, session, group} {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	b = binary.LittleEndian.AppendUint32(b, from)
	return binary.LittleEndian.AppendUint32(b, to)
}

// rawOpen sends one raw request and returns the status byte and the
// number of descriptors in the answer (closed).
func rawOpen(t *testing.T, path string, b, oob []byte) (byte, int) {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		return 0xff, 0 // refused before reading (too large for the socket)
	}
	buf := make([]byte, 4096)
	ob := make([]byte, unix.CmsgSpace(16))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, ob)
	if err != nil || n < 5 {
		t.Fatalf("no answer: %v", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(ob[:oobn])
		for _, m := range msgs {
			f, _ := unix.ParseUnixRights(&m)
			fds = append(fds, f...)
		}
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return buf[4], len(fds)
}

// TestDirectSenderEndKeepsItsLastFrames: a direct channel between two
// pods' attached members, made by their real sidecars; the sender sends
// copy, sealed-memfd and inline frames and closes its end while a credit
// of the receiver's is still unread in its socket (it was done sending).
// That resets the receiver's end, and Linux reports the reset once,
// before the frames still queued: the receiver must get every frame sent
// before the close, then io.EOF. The mixed Go/Python test lost a Go
// member's last echoes this way (sdk/python/tests/test_group_direct.py).
func TestDirectSenderEndKeepsItsLastFrames(t *testing.T) {
	op := messagingEnv(t)
	dirs := nodeDirs(t)
	a := startMsgPod(t, op, "ns-e", "pod-a", onNode(t, dirs, "node-a"))
	b := startMsgPod(t, op, "ns-e", "pod-b", onNode(t, dirs, "node-a"))
	ma := a.attach(t, "s1", "g", 0, 2, false)
	mb := b.attach(t, "s1", "g", 1, 2, false)
	waitLive(t, ma, 2)
	waitLive(t, mb, 2)
	ctx, cancel := within(time.Minute)
	defer cancel()
	sender, recv := openDirect(ctx, t, a, mb)
	defer recv.Close()
	sent := [][]byte{
		bytes.Repeat([]byte{1}, 1<<20), bytes.Repeat([]byte{2}, 1<<20), // copy frames
		bytes.Repeat([]byte{3}, directmsg.CopyMax+1), // a sealed memfd
		[]byte("last"),
	}
	for i, data := range sent {
		if err := sender.Send(ctx, int64(i), data); err != nil {
			t.Fatal(err)
		}
	}
	m, err := recv.Recv() // its credit stays unread in the sender's socket
	if err != nil || m.Tag != 0 || !bytes.Equal(m.Data, sent[0]) {
		t.Fatalf("message 0: tag %d, %d bytes, %v", m.Tag, len(m.Data), err)
	}
	if err := sender.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(sent); i++ {
		m, err := recv.Recv()
		if err != nil {
			t.Fatalf("message %d of the %d sent before the sender's close: %v", i, len(sent), err)
		}
		if m.Tag != int64(i) || !bytes.Equal(m.Data, sent[i]) {
			t.Fatalf("message %d: tag %d, %d bytes", i, m.Tag, len(m.Data))
		}
		if m.Mapped {
			_ = samenode.Unmap(m.Data)
		}
	}
	if _, err := recv.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the sender's last message: %v; want io.EOF", err)
	}
}

// openDirect opens the direct channel from rank 0 (pod a) to rank 1 (its
// member channel mb) of group g of session s1, both on one node: the
// sender's end, and the receiver's end as mb's push delivers it.
func openDirect(ctx context.Context, t *testing.T, a *msgPod, mb *localapi.MemberChannel) (sender, recv *directmsg.Conn) {
	t.Helper()
	f, err := a.msgClient(t).Open(ctx, "s1", "g", 0, 1)
	if err != nil || f == nil {
		t.Fatalf("open 0 -> 1 on one node: %v, %v; want direct", f, err)
	}
	if sender, err = directmsg.NewConn(f); err != nil {
		t.Fatal(err)
	}
	p := nextPush(t, mb)
	if p.Direct == nil || p.From != 0 {
		t.Fatalf("rank 1's member channel pushed %+v, want the direct channel from rank 0", p)
	}
	if recv, err = directmsg.NewConn(p.Direct); err != nil {
		t.Fatal(err)
	}
	return sender, recv
}
