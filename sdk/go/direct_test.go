package ziptrail

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/nodedir"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// Same-node direct channels against real sidecars (queue-proxy-zl
// processes on the operator's directory) whose pods share a node
// directory.

// tokenUID is the pod UID a token is bound to: the directory's pod_uid
// for that pod.
func tokenUID(t testing.TB, file string) string {
	t.Helper()
	uid, err := servers.TokenPodUID(file)
	if err != nil {
		t.Fatal(err)
	}
	return uid
}

// nodeDir makes a node directory.
func nodeDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "zn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := nodedir.Prepare(d); err != nil {
		t.Fatal(err)
	}
	return d
}

// startNodePod runs a pod's sidecar on node, sharing dir with the node's
// other pods; upstream is its function ("" none).
func startNodePod(t testing.TB, op *servers.Operator, ns, pod, node, dir, upstream string) *sidecar {
	t.Helper()
	tok := op.PodToken(t, ns, pod)
	return startSidecar(t, sidecarOpts{namespace: ns, upstream: upstream, env: []string{"SERVING_POD=" + pod,
		"ZIPTRAIL_OPERATOR_ADDR=" + op.Addr, "ZIPTRAIL_TOKEN_FILE=" + tok,
		"ZIPTRAIL_NODE_DIR=" + dir, "ZIPTRAIL_NODE_NAME=" + node, "ZIPTRAIL_POD_UID=" + tokenUID(t, tok)}})
}

// allDirect checks that every path g decided is a direct channel.
func allDirect(t *testing.T, gs []*Group) {
	t.Helper()
	for _, g := range gs {
		if g.att == nil {
			t.Fatalf("rank %d is not attached", g.rank)
		}
		g.att.omu.Lock()
		for to, oc := range g.att.out {
			if oc.decided && oc.c == nil {
				t.Errorf("rank %d -> %d went through the sidecars", g.rank, to)
			}
		}
		g.att.omu.Unlock()
	}
}

// TestDirectOrderAndBackPressure: on one node, 3000 messages of mixed
// sizes (inline frames and memfds) from one rank arrive in order; a
// receiver that does not read holds its sender back (a send times out)
// and loses nothing; a rank on another node sends over a TCP channel.
func TestDirectOrderAndBackPressure(t *testing.T) {
	op := servers.StartOperator(t)
	dir := nodeDir(t)
	a := startNodePod(t, op, "ns", "pod-a", "node-a", dir, "")
	b := startNodePod(t, op, "ns", "pod-b", "node-a", dir, "")
	far := startNodePod(t, op, "ns", "pod-c", "node-b", nodeDir(t), "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gs := joinAll(t, ctx, []*sidecar{a, b, far}, "s1", "g", 3)
	size := func(i int) int {
		switch {
		case i%500 == 7:
			return 300 << 10 // a memfd
		case i%50 == 3:
			return 64 << 10
		}
		return i % 200
	}
	const n = 3000
	done := make(chan error, 1)
	go func() {
		for i := range n {
			data := bytes.Repeat([]byte{byte(i)}, size(i))
			if err := gs[0].Send(ctx, 1, int64(i%7), data); err != nil {
				done <- fmt.Errorf("send %d: %w", i, err)
				return
			}
		}
		done <- gs[2].Send(ctx, 1, 99, []byte("from afar"))
	}()
	for i := range n {
		m, err := gs[1].Recv(ctx, 0, AnyTag)
		if err != nil {
			t.Fatalf("recv %d: %v", i, err)
		}
		if m.Tag != int64(i%7) || len(m.Bytes()) != size(i) || (size(i) > 0 && m.Bytes()[0] != byte(i)) {
			t.Fatalf("message %d: tag %d, %d bytes: out of order", i, m.Tag, len(m.Bytes()))
		}
		m.Close()
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m, err := gs[1].Recv(ctx, 2, 99); err != nil || string(m.Bytes()) != "from afar" {
		t.Fatalf("from the other node: %v", err)
	}
	allDirect(t, gs[:1])
	if oc := gs[2].att.out[1]; oc == nil || oc.c == nil || !oc.c.Stream() {
		t.Fatal("the other node's rank did not send over a TCP channel")
	}

	// Back-pressure: rank 1 reads nothing until rank 0 is held back, with
	// memfds (bounded by credits).
	for _, big := range []int{512 << 10, 9 << 20} {
		holdBack(t, ctx, gs[0], gs[1], big)
	}
}

// holdBack: rank to (of group g) reads nothing until from's sends of
// size-byte messages time out (no more than 400 of them); then 5 more
// sends go while to reads every message, whole and in order.
func holdBack(t *testing.T, ctx context.Context, from, to *Group, size int) {
	t.Helper()
	sent := 0
	for ; sent < 400; sent++ {
		sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
		err := from.Send(sctx, to.Rank(), 5, bytes.Repeat([]byte{byte(sent)}, size))
		scancel()
		if IsKind(err, KindTimeout) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if sent == 400 {
		t.Fatalf("%d MiB sent to a receiver that reads nothing: no back-pressure", sent*size>>20)
	}
	t.Logf("%d-byte messages: held back after %d messages (%d MiB)", size, sent, sent*size>>20)
	done := make(chan error, 1)
	go func() {
		for i := sent; i < sent+5; i++ {
			if err := from.Send(ctx, to.Rank(), 5, bytes.Repeat([]byte{byte(i)}, size)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := range sent + 5 {
		m, err := to.Recv(ctx, from.Rank(), 5)
		if err != nil || len(m.Bytes()) != size || m.Bytes()[0] != byte(i) || m.Bytes()[size-1] != byte(i) {
			t.Fatalf("message %d after the hold: %v", i, err)
		}
		m.Close()
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestDirectCollectives: every collective with 4 and 8 members on one
// node (two pods), small and large, through direct channels only.
func TestDirectCollectives(t *testing.T) {
	op := servers.StartOperator(t)
	dir := nodeDir(t)
	pods := []*sidecar{startNodePod(t, op, "ns", "pod-a", "node-a", dir, ""), startNodePod(t, op, "ns", "pod-b", "node-a", dir, "")}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, size := range []int{4, 8} {
		gs := joinAll(t, ctx, pods, "s1", fmt.Sprintf("c%d", size), size)
		for round, big := range []bool{false, true} {
			errs := eachMember(gs, func(g *Group) error { return collectiveRound(ctx, g, round, big) })
			for r, err := range errs {
				if err != nil {
					t.Fatalf("%d members, round %d (big %v), rank %d: %v", size, round, big, r, err)
				}
			}
		}
		allDirect(t, gs)
		for _, g := range gs {
			_ = g.Leave(ctx)
		}
	}
}

func fdCount(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestDirectHostilePeer: a peer that writes malformed or oversized
// frames, unsealed or wrong-size memfds or extra descriptors into its
// direct channel: the receiving SDK drops that channel with an error
// naming the rank, serves on, and keeps no descriptor.
func TestDirectHostilePeer(t *testing.T) {
	op := servers.StartOperator(t)
	dir := nodeDir(t)
	a := startNodePod(t, op, "ns", "pod-a", "node-a", dir, "")
	b := startNodePod(t, op, "ns", "pod-b", "node-a", dir, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	raw := localapi.NewMessageClient(localapi.MessageSocket(a.socket))
	defer raw.Close()
	header := func(kind byte, tag int64, size uint64) []byte {
		h := binary.LittleEndian.AppendUint32(nil, directmsg.Magic)
		h = append(h, kind)
		h = binary.LittleEndian.AppendUint64(h, uint64(tag))
		return binary.LittleEndian.AppendUint64(h, size)
	}
	memfd := func(size int, seal bool) *os.File {
		fd, err := unix.MemfdCreate("x", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "memfd")
		if err := f.Truncate(int64(size)); err != nil {
			t.Fatal(err)
		}
		if seal {
			if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, samenode.RequiredSeals); err != nil {
				t.Fatal(err)
			}
		}
		return f
	}
	type frame struct {
		b   []byte
		fds []*os.File
	}
	const big = directmsg.InlineMax + 1000
	cases := map[string]frame{
		"bad magic":              {b: append([]byte("XXXX"), header(1, 0, 0)[4:]...)},
		"short header":           {b: header(1, 0, 0)[:10]},
		"unknown kind":           {b: header(9, 0, 0)},
		"size it does not carry": {b: append(header(1, 0, 100), 1, 2, 3)},
		"oversized inline":       {b: append(header(1, 0, directmsg.InlineMax+50_000), make([]byte, directmsg.InlineMax+50_000)...)},
		"inline with a fd":       {b: append(header(1, 0, 2), 1, 2), fds: []*os.File{memfd(10, true)}},
		"unsealed memfd":         {b: header(2, 0, big), fds: []*os.File{memfd(big, false)}},
		"memfd of another size":  {b: header(2, 0, big), fds: []*os.File{memfd(big+4096, true)}},
		"memfd without its fd":   {b: header(2, 0, big)},
		"memfd with two fds":     {b: header(2, 0, big), fds: []*os.File{memfd(big, true), memfd(big, true)}},
		"memfd of 4 GiB":         {b: header(2, 0, 4<<30), fds: []*os.File{memfd(big, true)}},
	}
	// One group per case: the hostile rank 0 attaches with the raw
	// client, opens to rank 1 (a real SDK member) and writes the frame.
	run := func(i int, name string, fr frame) {
		group := fmt.Sprintf("h%d", i)
		mc, _, err := raw.Attach(ctx, "s1", group, 0, 2, false, "")
		if err != nil {
			t.Fatal(err)
		}
		defer mc.Close()
		g1, err := b.client.Join(ctx, "s1", group, 1, 2, WithWaitAll())
		if err != nil {
			t.Fatal(err)
		}
		defer g1.Leave(ctx)
		for { // until rank 0's sidecar lists rank 1
			p, err := mc.Next()
			if err != nil {
				t.Fatal(err)
			}
			if p.View != nil && len(p.View.Live) == 2 {
				break
			}
		}
		f, err := raw.Open(ctx, "s1", group, 0, 1)
		if err != nil || f == nil {
			t.Fatalf("%s: open: %v %v", name, f, err)
		}
		defer f.Close()
		// A good frame first: it arrives.
		good := append(header(1, 3, 2), 'o', 'k')
		if err := unix.Sendmsg(int(f.Fd()), good, nil, nil, 0); err != nil {
			t.Fatal(err)
		}
		var oob []byte
		if len(fr.fds) > 0 {
			var fds []int
			for _, x := range fr.fds {
				fds = append(fds, int(x.Fd()))
			}
			oob = unix.UnixRights(fds...)
		}
		if err := unix.Sendmsg(int(f.Fd()), fr.b, oob, nil, 0); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, x := range fr.fds {
			x.Close()
		}
		m, err := g1.Recv(ctx, 0, AnyTag)
		if err != nil || string(m.Bytes()) != "ok" {
			t.Fatalf("%s: the good frame: %v", name, err)
		}
		_, err = g1.Recv(ctx, 0, AnyTag)
		var pe *PeerError
		if !IsKind(err, KindInternal) || !errors.As(err, &pe) || pe.Rank != 0 {
			t.Fatalf("%s: recv: %v; want an error naming rank 0", name, err)
		}
		// Another receive says so again rather than waiting forever.
		if _, err = g1.Recv(ctx, 0, AnyTag); !errors.As(err, &pe) {
			t.Fatalf("%s: second recv: %v", name, err)
		}
	}
	run(-1, "bad magic", cases["bad magic"]) // warm-up: pooled connections
	before := fdCount(t)
	i := 0
	for name, fr := range cases {
		run(i, name, fr)
		i++
	}
	deadline := time.Now().Add(time.Minute)
	for fdCount(t) > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := fdCount(t); n > before {
		t.Fatalf("%d descriptors open, %d before the hostile frames", n, before)
	}
}

// The killed peer: a child process serves rank 0's function behind its
// sidecar; it joins, sends one message over a direct channel, and waits.
func init() {
	if os.Getenv("ZT_DIRECT_CHILD") == "" {
		return
	}
	err := Serve(context.Background(), func(ctx context.Context, inv *Invocation) ([]byte, error) {
		g, err := JoinGroup(ctx, "k", 0, 2, WithWaitAll())
		if err != nil {
			return nil, err
		}
		if err := g.Send(ctx, 1, 1, []byte("before")); err != nil {
			return nil, err
		}
		select {}
	})
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// TestDirectPeerKilled: the sender's function process is SIGKILLed while
// it holds its direct channel: its sidecar sees the invocation fail, the
// directory announces rank 0 gone, and the receiver, once it drained the
// channel, gets PeerGone naming rank 0. Its pod on the same node (a
// socketpair) and on another node (a TCP channel). Then as a node that
// goes away (powered off, cut off): the sender's process frozen (SIGSTOP:
// its socket sends no FIN) and its pod's sidecar SIGKILLed: the view says
// rank 0 is gone, and the receiver takes the quiet TCP channel for ended.
func TestDirectPeerKilled(t *testing.T) {
	for _, c := range []struct {
		name           string
		across, frozen bool
	}{{"same node", false, false}, {"across nodes", true, false}, {"node gone", true, true}} {
		t.Run(c.name, func(t *testing.T) { testDirectPeerKilled(t, c.across, c.frozen) })
	}
}

func testDirectPeerKilled(t *testing.T, across, frozen bool) {
	op := servers.StartOperator(t)
	dir := nodeDir(t)
	bNode, bDir := "node-a", dir
	if across {
		bNode, bDir = "node-b", nodeDir(t)
	}
	b := startNodePod(t, op, "ns", "pod-b", bNode, bDir, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The child listens on a port chosen free here, which another
	// process may take first (CI runs other suites): then it exits, and
	// the pod is made again with another port.
	var a *sidecar
	var child *exec.Cmd
	for attempt := 0; child == nil; attempt++ {
		if attempt == 3 {
			t.Fatal("the child could not listen three times")
		}
		port := servers.FreePort(t)
		a = startNodePod(t, op, "ns", fmt.Sprintf("pod-a%d", attempt), "node-a", dir, fmt.Sprintf("http://127.0.0.1:%d", port))
		c := exec.Command(os.Args[0], "-test.run=^$")
		c.Env = append(os.Environ(), append(a.env, "ZT_DIRECT_CHILD=1", fmt.Sprintf("PORT=%d", port))...)
		c.Stderr = os.Stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = c.Wait(); close(exited) }()
		if listening(ctx, port, exited) {
			child = c
			defer child.Process.Kill()
		} else if ctx.Err() != nil {
			t.Fatal("the child never listened")
		}
	}
	go func() {
		data, _ := json.Marshal(invocation.Envelope{Namespace: "ns", Function: "f", Session: "s1", Invocation: "i1"})
		resp, err := http.Post(a.url(), invocation.ContentType, bytes.NewReader(data))
		if err == nil {
			resp.Body.Close()
		}
	}()
	g1, err := b.client.Join(ctx, "s1", "k", 1, 2, WithWaitAll())
	if err != nil {
		t.Fatal(err)
	}
	m, err := g1.Recv(ctx, 0, AnyTag)
	if err != nil || string(m.Bytes()) != "before" {
		t.Fatalf("recv: %v", err)
	}
	g1.att.mu.Lock()
	ic := g1.att.in[0]
	g1.att.mu.Unlock()
	if ic == nil || ic.c == nil || ic.c.Stream() != across {
		t.Fatalf("the message did not come over a direct channel (TCP: %v)", across)
	}
	killed := time.Now()
	if frozen {
		if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		a.kill()
	} else if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, err = g1.Recv(ctx, 0, AnyTag)
	var pe *PeerError
	if !errors.Is(err, ErrPeerGone) || !errors.As(err, &pe) || pe.Rank != 0 {
		t.Fatalf("recv after the kill: %v, want PeerGone naming rank 0", err)
	}
	t.Logf("PeerGone %v after the SIGKILL", time.Since(killed))
	if err := g1.Send(ctx, 0, 1, []byte("anyone?")); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send after the kill: %v, want PeerGone", err)
	}
}

// listening waits until 127.0.0.1:port accepts a connection; false when
// exited closes first (the process that was to listen ended) or ctx ends.
func listening(ctx context.Context, port int, exited <-chan struct{}) bool {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return true
		}
		select {
		case <-exited:
			return false
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// twoOnANode joins ranks 0 and 1 of group g (session s1) from two pods
// of one node, each behind its real sidecar.
func twoOnANode(t *testing.T, ctx context.Context, opts ...JoinOption) []*Group {
	t.Helper()
	op := servers.StartOperator(t)
	dir := nodeDir(t)
	a := startNodePod(t, op, "ns", "pod-a", "node-a", dir, "")
	b := startNodePod(t, op, "ns", "pod-b", "node-a", dir, "")
	return joinAll(t, ctx, []*sidecar{a, b}, "s1", "g", 2, opts...)
}

// memfdMappings counts this process's mappings of message memfds.
func memfdMappings(t *testing.T) int {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(maps, []byte("memfd:ziptrail:msg"))
}

// TestDirectLargeMessagesAreUnmapped: a message over directmsg.CopyMax
// arrives as a sealed memfd the receiver maps; Message.Close unmaps it,
// for a plain receive and a collective's result alike. (Close used
// syscall.Munmap, which does not know x/sys/unix's mappings: every such
// message stayed mapped, 64 MB each in bench/messaging.)
func TestDirectLargeMessagesAreUnmapped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gs := twoOnANode(t, ctx)
	before := memfdMappings(t)
	big := bytes.Repeat([]byte{7}, directmsg.CopyMax+1)
	for i := range 8 {
		if err := gs[0].Send(ctx, 1, 1, big); err != nil {
			t.Fatal(err)
		}
		m, err := gs[1].Recv(ctx, 0, 1)
		if err != nil || !m.Mapped() || !bytes.Equal(m.Bytes(), big) {
			t.Fatalf("message %d: %v", i, err)
		}
		if err := m.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
	}
	errs := eachMember(gs, func(g *Group) error {
		var data []byte
		if g.Rank() == 0 {
			data = big
		}
		m, err := g.Broadcast(ctx, 0, data)
		if err != nil {
			return err
		}
		if !bytes.Equal(m.Bytes(), big) {
			return fmt.Errorf("rank %d: the broadcast differs", g.Rank())
		}
		return m.Close()
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	allDirect(t, gs)
	if n := memfdMappings(t); n != before {
		t.Fatalf("%d message memfds still mapped after every message was closed (%d before)", n, before)
	}
}
