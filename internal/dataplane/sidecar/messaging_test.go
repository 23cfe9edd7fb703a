package sidecar

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// The messaging tests run sidecars connected to the operator's real
// control server (TokenReview on a real API server), whose directory
// resolves ranks, and Redis as the fast tier for mailboxes.

type msgPod struct {
	s    *Sidecar
	sdk  *localapi.Client
	stop context.CancelFunc
	ns   string
}

// shmDir is an object directory in shared memory (tmpfs), as in a pod,
// when the machine has /dev/shm.
func shmDir(t testing.TB) string {
	dir, err := os.MkdirTemp("/dev/shm", "zt-objects-")
	if err != nil {
		return filepath.Join(t.TempDir(), "objects")
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func startMsgPod(t *testing.T, op *servers.Operator, ns, pod string, opts ...func(*Config)) *msgPod {
	return startMsgPodB(t, op, ns, pod, opts...)
}

func startMsgPodB(t testing.TB, op *servers.Operator, ns, pod string, opts ...func(*Config)) *msgPod {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "zt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	cfg := Config{Namespace: ns, Pod: pod, PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: shmDir(t),
		MemoryLimit: 256 << 20, InlineThreshold: 64 << 10, ObjectTTL: time.Minute, OperatorAddr: op.Addr, TokenFile: op.PodToken(t, ns, pod),
		APISocket: filepath.Join(sockDir, "sidecar.sock"), BackupTimeout: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	s := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	sdk, err := localapi.Dial(cfg.APISocket, cfg.ShmDir)
	if err != nil {
		t.Fatal(err)
	}
	sdk.InlineThreshold = cfg.InlineThreshold
	t.Cleanup(func() { sdk.Close() })
	// The operator sends the tiers, then the keys: ready once keys came.
	wctx, wcancel := within(time.Minute)
	defer wcancel()
	if err := s.waitKeys(wctx); err != nil {
		t.Fatal(err)
	}
	return &msgPod{s: s, sdk: sdk, stop: cancel, ns: ns}
}

func (p *msgPod) join(t *testing.T, session, group string, rank, size uint32, mailbox bool) *sidecarv1.MembersResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := p.sdk.RPC().Join(ctx, &sidecarv1.JoinRequest{Session: session, Group: group, Rank: rank, Size: size, Mailbox: mailbox})
	if err != nil {
		t.Fatalf("join %s rank %d: %v", group, rank, err)
	}
	return m
}

func (p *msgPod) send(ctx context.Context, session, group string, from, to uint32, tag int64, data []byte) (*sidecarv1.SendResponse, error) {
	payload, err := p.sdk.Payload(data)
	if err != nil {
		return nil, err
	}
	return p.sdk.RPC().Send(ctx, &sidecarv1.SendRequest{Session: session, Group: group, From: from, To: to, Tag: tag, Data: payload})
}

func (p *msgPod) recv(ctx context.Context, session, group string, rank uint32, from uint32, timeoutMs int64) (uint32, []byte, error) {
	m, err := p.sdk.RPC().Recv(ctx, &sidecarv1.RecvRequest{Session: session, Group: group, Rank: rank, From: from, AnyTag: true, TimeoutMs: timeoutMs})
	if err != nil {
		return 0, nil, err
	}
	data, err := p.sdk.Bytes(m.Data)
	return m.From, data, err
}

var msgOp struct {
	op    *servers.Operator
	redis *servers.Redis
}

func messagingEnv(t *testing.T) *servers.Operator {
	t.Helper()
	op := servers.StartOperator(t)
	r := servers.StartRedis(t)
	op.Server.Tiers = &controlv1.Tiers{RedisAddr: r.Addr}
	return op
}

func within(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// TestMessagingBetweenPods: point to point across two pods, small and
// large (by reference) messages, order per sender kept; then the errors a
// careless or hostile caller meets.
func TestMessagingBetweenPods(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "team-a", "pod-a")
	b := startMsgPod(t, op, "team-a", "pod-b")
	a.join(t, "s1", "g", 0, 2, false)
	v := b.join(t, "s1", "g", 1, 2, false)
	if v.Size != 2 {
		t.Fatalf("view size %d", v.Size)
	}
	ctx, cancel := within(time.Minute)
	defer cancel()

	big := make([]byte, 3<<20) // above the inline size: travels by reference
	_, _ = rand.Read(big)
	msgs := [][]byte{[]byte("one"), big, []byte("three"), {}}
	for i, m := range msgs {
		if _, err := a.send(ctx, "s1", "g", 0, 1, int64(i), m); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	for i, want := range msgs {
		from, got, err := b.recv(ctx, "s1", "g", 1, 0, 0)
		if err != nil {
			t.Fatalf("recv %d: %v", i, err)
		}
		if from != 0 || !bytes.Equal(got, want) {
			t.Fatalf("message %d: from %d, %d bytes, want %d bytes from 0", i, from, len(got), len(want))
		}
	}

	t.Run("recv times out with MSG_TIMEOUT", func(t *testing.T) {
		_, _, err := b.recv(ctx, "s1", "g", 1, 0, 50)
		if r := localapi.Reason(err); r != localapi.ReasonMsgTimeout {
			t.Fatalf("reason %q (%v), want %s", r, err, localapi.ReasonMsgTimeout)
		}
	})
	t.Run("a rank this pod does not run is GROUP_CLOSED", func(t *testing.T) {
		_, err := a.send(ctx, "s1", "g", 1, 0, 0, []byte("x")) // rank 1 is b's
		if r := localapi.Reason(err); r != localapi.ReasonGroupClosed {
			t.Fatalf("reason %q (%v)", r, err)
		}
		_, _, err = a.recv(ctx, "s1", "g", 1, 0, 50)
		if r := localapi.Reason(err); r != localapi.ReasonGroupClosed {
			t.Fatalf("reason %q (%v)", r, err)
		}
	})
	t.Run("a taken rank or another size is GROUP_CONFLICT", func(t *testing.T) {
		for _, req := range []*sidecarv1.JoinRequest{{Session: "s1", Group: "g", Rank: 1, Size: 2}, {Session: "s1", Group: "g", Rank: 0, Size: 3}} {
			_, err := a.sdk.RPC().Join(ctx, req)
			if r := localapi.Reason(err); r != localapi.ReasonGroupConflict {
				t.Fatalf("join %v: reason %q (%v)", req, r, err)
			}
		}
	})
	t.Run("a rank outside the group is MSG_INVALID", func(t *testing.T) {
		_, err := a.send(ctx, "s1", "g", 0, 7, 0, []byte("x"))
		if r := localapi.Reason(err); r != localapi.ReasonMsgInvalid {
			t.Fatalf("reason %q (%v)", r, err)
		}
	})
	// (A pod's death, SIGKILL of its sidecar, is the SDKs' tests': they
	// kill real queue-proxy-zl processes.)
	t.Run("a peer that leaves is PEER_GONE", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, _, err := a.recv(ctx, "s1", "g", 0, 1, 0); done <- err }()
		if _, err := b.sdk.RPC().Leave(ctx, &sidecarv1.LeaveRequest{Session: "s1", Group: "g", Rank: 1}); err != nil {
			t.Fatal(err)
		}
		err := <-done
		if r := localapi.Reason(err); r != localapi.ReasonPeerGone {
			t.Fatalf("reason %q (%v)", r, err)
		}
		_, err = a.send(ctx, "s1", "g", 0, 1, 0, []byte("late"))
		if r := localapi.Reason(err); r != localapi.ReasonPeerGone {
			t.Fatalf("send to the gone rank: reason %q (%v)", r, err)
		}
	})
}

// TestMessagingRefusesForeignDeliveries: straight to a sidecar's data
// plane port, a delivery sealed with another namespace's key (or none, or
// for another group) is refused, and nothing reaches the member.
func TestMessagingRefusesForeignDeliveries(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "team-a", "pod-a")
	other := startMsgPod(t, op, "team-b", "pod-x")
	a.join(t, "s1", "g", 0, 2, false)
	other.join(t, "s1", "g", 1, 2, false) // same names, another namespace: another group

	foreignKeys := other.s.keys.Load()
	ownKeys := a.s.keys.Load()
	seal := func(kr *ref.Keyring, key string) string {
		tok, err := kr.Seal(ref.Record{Addr: "10.0.0.9:9192", Key: key, Expires: time.Now().Add(time.Minute), Reads: 1})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	var cl messaging.Streams
	defer cl.Close()
	ctx, cancel := within(time.Minute)
	defer cancel()
	for name, auth := range map[string]string{
		"another namespace's key": seal(foreignKeys, "msg\x00s1\x00g"),
		"no authenticator":        "",
		"garbage":                 "not-a-token",
		"another group's":         seal(ownKeys, "msg\x00s1\x00other"),
	} {
		for _, body := range [][]byte{[]byte("forged"), bytes.Repeat([]byte{7}, 1<<20)} { // in memory, or a file at the receiver
			st, err := cl.Deliver(ctx, a.s.addr(), auth, messaging.Message{Session: "s1", Group: "g", From: 1, To: 0, Data: body}, nil)
			if err != nil || st != messaging.Foreign {
				t.Fatalf("%s (%d bytes): status %v, err %v; want foreign", name, len(body), st, err)
			}
		}
	}
	// A malformed frame ends the stream, and the sidecar serves on.
	conn, err := net.Dial("tcp", a.s.addr())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write(append(messaging.StreamMagic[:], 0xff, 0xff, 0xff, 0x7f))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("the sidecar answered a malformed frame instead of closing the stream")
	}
	conn.Close()
	entries, _ := os.ReadDir(a.s.cfg.ShmDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "msg-") || strings.HasPrefix(e.Name(), "get-") {
			t.Fatalf("a refused message left %s in the object directory", e.Name())
		}
	}
	// Nothing forged reached the member.
	_, _, err = a.recv(ctx, "s1", "g", 0, 1, 100)
	if r := localapi.Reason(err); r != localapi.ReasonMsgTimeout {
		t.Fatalf("a forged message reached the member, or another error: reason %q (%v)", r, err)
	}
	// The namespaces' groups are apart: team-b's rank 1 is not team-a's,
	// so a send waits for a team-a rank 1 that never joins.
	_, err = a.sdk.RPC().Send(ctx, &sidecarv1.SendRequest{Session: "s1", Group: "g", From: 0, To: 1,
		Data: &sidecarv1.Payload{Source: &sidecarv1.Payload_Inline{Inline: []byte("x")}}, TimeoutMs: 300})
	if r := localapi.Reason(err); r != localapi.ReasonMsgTimeout {
		t.Fatalf("send to team-b's rank: reason %q (%v), want %s", r, err, localapi.ReasonMsgTimeout)
	}
}

// TestMessagingMailbox: a message to a rank that has not joined waits in
// the fast tier and reaches the instance that joins later as that rank.
func TestMessagingMailbox(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "team-a", "pod-a")
	a.join(t, "s1", "mb", 0, 2, true)
	ctx, cancel := within(time.Minute)
	defer cancel()
	for i := range 3 {
		resp, err := a.send(ctx, "s1", "mb", 0, 1, 0, fmt.Appendf(nil, "early-%d", i))
		if err != nil || !resp.Mailboxed {
			t.Fatalf("send %d: %v (mailboxed %v)", i, err, resp.GetMailboxed())
		}
	}
	b := startMsgPod(t, op, "team-a", "pod-b")
	b.join(t, "s1", "mb", 1, 2, true)
	if _, err := a.send(ctx, "s1", "mb", 0, 1, 0, []byte("direct")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"early-0", "early-1", "early-2", "direct"} {
		_, got, err := b.recv(ctx, "s1", "mb", 1, 0, 0)
		if err != nil || string(got) != want {
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("deadline")
	}
}

// TestMessagingTerminatingPodServesLiveMembers: a pod Knative scales
// away (SIGTERM: the sidecar's context ends) keeps its data plane and
// local API while a group member still runs in it, so the group is not
// cut under its members; once the member leaves, the sidecar shuts down.
func TestMessagingTerminatingPodServesLiveMembers(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "team-a", "pod-a")
	b := startMsgPod(t, op, "team-a", "pod-b")
	a.join(t, "s1", "g", 0, 2, false)
	b.join(t, "s1", "g", 1, 2, false)
	ctx, cancel := within(time.Minute)
	defer cancel()

	b.stop() // SIGTERM while rank 1 runs
	<-b.s.BackedUp()
	if _, err := a.send(ctx, "s1", "g", 0, 1, 0, []byte("after SIGTERM")); err != nil {
		t.Fatalf("send to the terminating pod's live member: %v", err)
	}
	if _, got, err := b.recv(ctx, "s1", "g", 1, 0, 0); err != nil || string(got) != "after SIGTERM" {
		t.Fatalf("the terminating pod's member received %q, %v", got, err)
	}
	if _, err := b.sdk.RPC().Leave(ctx, &sidecarv1.LeaveRequest{Session: "s1", Group: "g", Rank: 1}); err != nil {
		t.Fatal(err)
	}
	// Now the sidecar closes: its rank is gone for the others.
	_, _, err := a.recv(ctx, "s1", "g", 0, 1, 0)
	if r := localapi.Reason(err); r != localapi.ReasonPeerGone {
		t.Fatalf("reason %q (%v)", r, err)
	}
}

// smallTmpfs is a directory on a tmpfs of its own of the given size, as a
// pod's shared-memory emptyDir with a sizeLimit (mounting needs
// CAP_SYS_ADMIN, which the test machine's root has).
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mount a %s tmpfs at %s (this test needs root): %v", size, dir, err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// TestMessagingReceiverShmFull: a message larger than the room left in the
// receiving pod's shared-memory directory (really full: a 1 MiB tmpfs) is
// refused there and the sender gets STORE_FULL naming the receiver — not
// a sidecar killed by SIGBUS, not a message silently dropped, no partial
// file left; the receiver's sidecar serves on, and a message that fits
// still arrives.
func TestMessagingReceiverShmFull(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "team-a", "pod-a")
	full := smallTmpfs(t, "1m")
	b := startMsgPod(t, op, "team-a", "pod-b", func(c *Config) { c.ShmDir = full })
	a.join(t, "s1", "g", 0, 2, false)
	b.join(t, "s1", "g", 1, 2, false)
	ctx, cancel := within(time.Minute)
	defer cancel()

	big := bytes.Repeat([]byte("x"), 4<<20)
	_, err := a.send(ctx, "s1", "g", 0, 1, 0, big)
	if r := localapi.Reason(err); r != localapi.ReasonStoreFull || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("a 4 MiB message into a 1 MiB directory: reason %q (%v), want STORE_FULL naming rank 1", r, err)
	}
	if entries, _ := os.ReadDir(full); len(entries) != 0 {
		t.Fatalf("the refused message left %d file(s) in the receiver's directory", len(entries))
	}
	small := bytes.Repeat([]byte("y"), 200<<10) // a file too, and it fits
	if _, err := a.send(ctx, "s1", "g", 0, 1, 7, small); err != nil {
		t.Fatalf("a message that fits, after the refused one: %v", err)
	}
	if _, got, err := b.recv(ctx, "s1", "g", 1, 0, 0); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("the receiver got %d bytes, %v (want the 200 KiB message, and not the refused one)", len(got), err)
	}
}

// TestMessagingFastPath: Send and Recv on the fast path's socket between
// two pods: small messages in the frames, a large one as files at both
// ends (the receiver maps a file its sidecar wrote), the same error
// classes as the gRPC calls; and a malformed frame straight to the socket
// gets BAD_PAYLOAD and a closed connection while the sidecar serves on.
func TestMessagingFastPath(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "team-a", "pod-a")
	b := startMsgPod(t, op, "team-a", "pod-b")
	a.join(t, "s1", "g", 0, 2, false)
	b.join(t, "s1", "g", 1, 2, false)
	fa := localapi.NewMessageClient(localapi.MessageSocket(a.s.cfg.APISocket))
	fb := localapi.NewMessageClient(localapi.MessageSocket(b.s.cfg.APISocket))
	defer fa.Close()
	defer fb.Close()
	ctx, cancel := within(time.Minute)
	defer cancel()

	big := make([]byte, 5<<20)
	_, _ = rand.Read(big)
	bigFile := filepath.Join(a.s.cfg.ShmDir, "out-big")
	if err := os.WriteFile(bigFile, big, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := fa.Send(ctx, "s1", "g", 0, 1, 3, []byte("hi"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := fa.Send(ctx, "s1", "g", 0, 1, 4, nil, bigFile); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bigFile); !os.IsNotExist(err) {
		t.Fatalf("the sender's file is still there after the send: %v", err)
	}
	m, err := fb.Recv(ctx, "s1", "g", 1, true, 0, false, 3)
	if err != nil || string(m.Data) != "hi" || m.From != 0 || m.Tag != 3 {
		t.Fatalf("small: %+v, %v", m, err)
	}
	m, err = fb.Recv(ctx, "s1", "g", 1, false, 0, true, 0)
	if err != nil || m.Path == "" || m.Size != uint64(len(big)) {
		t.Fatalf("large: %+v, %v", m, err)
	}
	got, err := os.ReadFile(m.Path)
	if err != nil || !bytes.Equal(got, big) || filepath.Dir(m.Path) != b.s.cfg.ShmDir {
		t.Fatalf("large message's file %s: %d bytes, %v", m.Path, len(got), err)
	}
	os.Remove(m.Path)

	tctx, tcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = fb.Recv(tctx, "s1", "g", 1, true, 0, true, 0)
	tcancel()
	var me *localapi.MessageError
	if !errors.As(err, &me) || me.Reason != localapi.ReasonMsgTimeout {
		t.Fatalf("timeout: %v", err)
	}
	if _, err := fa.Send(ctx, "s1", "g", 1, 0, 0, []byte("x"), ""); !errors.As(err, &me) || me.Reason != localapi.ReasonGroupClosed {
		t.Fatalf("send as another pod's rank: %v", err)
	}
	if _, err := fa.Send(ctx, "s1", "g", 0, 1, 0, nil, "/etc/passwd"); !errors.As(err, &me) || me.Reason != localapi.ReasonBadPayload {
		t.Fatalf("a path outside the object directory: %v", err)
	}

	// Straight to the socket: a frame announcing 2 GiB.
	conn, err := net.Dial("unix", localapi.MessageSocket(a.s.cfg.APISocket))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte{0, 0, 0, 0x80})
	reply, _ := io.ReadAll(conn)
	conn.Close()
	if !bytes.Contains(reply, []byte(localapi.ReasonBadPayload)) {
		t.Fatalf("malformed frame: reply %q", reply)
	}
	if _, err := fa.Send(ctx, "s1", "g", 0, 1, 0, []byte("still serving"), ""); err != nil {
		t.Fatal(err)
	}
	if m, err := fb.Recv(ctx, "s1", "g", 1, true, 0, true, 0); err != nil || string(m.Data) != "still serving" {
		t.Fatalf("%+v %v", m, err)
	}
}

// TestShuffleTiers: a function writes and reads partitions in the fast
// and slow tiers through its sidecar (which holds the credentials); keys
// are the namespace's: another namespace's pod does not see them; bad
// keys and tiers are refused with their class.
func TestShuffleTiers(t *testing.T) {
	op := messagingEnv(t)
	m := servers.StartMinIO(t)
	op.Server.Tiers.S3Endpoint, op.Server.Tiers.S3AccessKey, op.Server.Tiers.S3SecretKey = m.Endpoint, m.AccessKey, m.SecretKey
	op.Server.Tiers.S3Bucket = m.Bucket(t, "ziptrail")
	a := startMsgPod(t, op, "team-a", "pod-a")
	b := startMsgPod(t, op, "team-a", "pod-b")
	x := startMsgPod(t, op, "team-b", "pod-x")
	ctx, cancel := within(time.Minute)
	defer cancel()
	big := bytes.Repeat([]byte("partition"), 200_000) // 1.8 MB: a payload file
	for _, tr := range []sidecarv1.Tier{sidecarv1.Tier_TIER_FAST, sidecarv1.Tier_TIER_SLOW} {
		for key, data := range map[string][]byte{"r0/m0": []byte("small"), "r0/m1": big, "empty": {}} {
			p, err := a.sdk.Payload(data)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.sdk.RPC().TierPut(ctx, &sidecarv1.TierPutRequest{Tier: tr, Session: "s1", Key: key, Object: p}); err != nil {
				t.Fatalf("%v put %s: %v", tr, key, err)
			}
			got, err := b.sdk.RPC().TierGet(ctx, &sidecarv1.TierGetRequest{Tier: tr, Session: "s1", Key: key})
			if err != nil {
				t.Fatalf("%v get %s: %v", tr, key, err)
			}
			if g, _ := b.sdk.Bytes(got.Object); !bytes.Equal(g, data) {
				t.Fatalf("%v %s: got %d bytes, want %d", tr, key, len(g), len(data))
			}
			// Another namespace's pod has its own key space.
			_, err = x.sdk.RPC().TierGet(ctx, &sidecarv1.TierGetRequest{Tier: tr, Session: "s1", Key: key})
			if r := localapi.Reason(err); r != localapi.ReasonNotFound {
				t.Fatalf("%v: team-b read team-a's %s: reason %q (%v)", tr, key, r, err)
			}
		}
		if _, err := a.sdk.RPC().TierDelete(ctx, &sidecarv1.TierDeleteRequest{Tier: tr, Session: "s1", Keys: []string{"r0/m0"}}); err != nil {
			t.Fatal(err)
		}
		_, err := b.sdk.RPC().TierGet(ctx, &sidecarv1.TierGetRequest{Tier: tr, Session: "s1", Key: "r0/m0"})
		if r := localapi.Reason(err); r != localapi.ReasonNotFound {
			t.Fatalf("%v: deleted key: reason %q (%v)", tr, r, err)
		}
	}
	for name, req := range map[string]*sidecarv1.TierGetRequest{
		"no tier":          {Session: "s1", Key: "k"},
		"no session":       {Tier: sidecarv1.Tier_TIER_FAST, Key: "k"},
		"session with '/'": {Tier: sidecarv1.Tier_TIER_FAST, Session: "../other", Key: "k"},
		"key too long":     {Tier: sidecarv1.Tier_TIER_FAST, Session: "s1", Key: strings.Repeat("k", 513)},
	} {
		_, err := a.sdk.RPC().TierGet(ctx, req)
		if r := localapi.Reason(err); r != localapi.ReasonBadPayload {
			t.Fatalf("%s: reason %q (%v)", name, r, err)
		}
	}
}

// BenchmarkMessagePingPong: a message of 64 B (or 1 MiB) to another pod
// and back through two in-process sidecars on the fast path: one op is a
// round trip (one-way = half).
func BenchmarkMessagePingPong(b *testing.B) {
	op := servers.StartOperator(b)
	a := startMsgPodB(b, op, "bench", "a")
	c := startMsgPodB(b, op, "bench", "c")
	ctx := context.Background()
	for i, p := range []*msgPod{a, c} {
		if _, err := p.sdk.RPC().Join(ctx, &sidecarv1.JoinRequest{Session: "s", Group: "pp", Rank: uint32(i), Size: 2, WaitAll: i == 1}); err != nil {
			b.Fatal(err)
		}
	}
	for _, size := range []int{64, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			fa := localapi.NewMessageClient(localapi.MessageSocket(a.s.cfg.APISocket))
			fc := localapi.NewMessageClient(localapi.MessageSocket(c.s.cfg.APISocket))
			defer fa.Close()
			defer fc.Close()
			msg := make([]byte, size)
			done := make(chan error, 1)
			go func() { // the echo
				for range b.N {
					m, err := fc.Recv(ctx, "s", "pp", 1, false, 0, true, 0)
					if err == nil {
						if m.Path != "" {
							os.Remove(m.Path)
						}
						_, err = fc.Send(ctx, "s", "pp", 1, 0, 0, msg, "")
					}
					if err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			b.SetBytes(int64(size))
			cpu0 := cpuTime()
			b.ResetTimer()
			for range b.N {
				if _, err := fa.Send(ctx, "s", "pp", 0, 1, 0, msg, ""); err != nil {
					b.Fatal(err)
				}
				m, err := fa.Recv(ctx, "s", "pp", 0, false, 1, true, 0)
				if err != nil {
					b.Fatal(err)
				}
				if m.Path != "" {
					os.Remove(m.Path)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			// CPU time of both pods and both functions per round trip: a
			// measure that a busy machine disturbs less than wall time.
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
