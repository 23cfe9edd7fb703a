package ziptrail

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestLargeMessagesReuseFiles: large messages across two sidecars reuse
// their files at both ends (docs/messaging.md, "Reused files"): the
// receiver's sidecar lends its file, which Close gives back and the next
// message fills again; the sender's file comes back once sent and holds
// its next message. A message kept open keeps its bytes while later ones
// arrive (its file is not filled again before Close), and forged releases
// change nothing.
func TestLargeMessagesReuseFiles(t *testing.T) {
	op := servers.StartOperator(t)
	a, b := startPod(t, op, "ns", "pod-a", viaSidecars), startPod(t, op, "ns", "pod-b", viaSidecars)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gs := joinAll(t, ctx, []*sidecar{a, b}, "s1", "files", 2)
	g0, g1 := gs[0], gs[1]
	names := func(s *sidecar, prefix string) map[string]bool {
		out := map[string]bool{}
		for _, n := range s.shmFiles(t) {
			if strings.HasPrefix(n, prefix) {
				out[n] = true
			}
		}
		return out
	}
	const size = 1 << 20
	sent, lent := map[string]bool{}, map[string]bool{}
	for i := range 20 {
		want := bytes.Repeat([]byte{byte(i + 1)}, size)
		if err := g0.Send(ctx, 1, 0, want); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		for n := range names(a, "put-") {
			sent[n] = true
		}
		m, err := g1.Recv(ctx, 0, 0)
		if err != nil {
			t.Fatalf("recv %d: %v", i, err)
		}
		if !m.Mapped() || !bytes.Equal(m.Bytes(), want) {
			t.Fatalf("message %d: mapped %v, bytes %v", i, m.Mapped(), !bytes.Equal(m.Bytes(), want))
		}
		for n := range names(b, "get-") {
			lent[n] = true
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// New files each time would have been 20 names at each end (and none
	// left to see: the old path removed them at once).
	if len(sent) == 0 || len(sent) > 2 {
		t.Fatalf("the sender used %d files for 20 messages (%v), want 1 or 2 reused", len(sent), sent)
	}
	if len(lent) == 0 || len(lent) > 3 {
		t.Fatalf("the receiver's sidecar used %d files for 20 messages (%v), want 1 to 3 reused", len(lent), lent)
	}

	// A message kept open keeps its bytes while later ones arrive, and
	// forged releases (unknown files, a real file's next lending, garbage)
	// are ignored.
	g1.att.mc.Release("nonsense", "get-x:1", "../../etc/passwd:1")
	for n := range names(b, "get-") {
		g1.att.mc.Release(n+":99", n+":0")
	}
	held := bytes.Repeat([]byte{0xAA}, size)
	if err := g0.Send(ctx, 1, 1, held); err != nil {
		t.Fatal(err)
	}
	first, err := g1.Recv(ctx, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		want := bytes.Repeat([]byte{byte(0x10 + i)}, size)
		if err := g0.Send(ctx, 1, 2, want); err != nil {
			t.Fatal(err)
		}
		m, err := g1.Recv(ctx, 0, 2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Bytes(), want) {
			t.Fatalf("message %d while one is held: wrong bytes", i)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(first.Bytes(), held) {
		t.Fatal("a message kept open changed while later messages arrived (its file was filled again)")
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// More large messages queued unread than the sidecar lends at once
	// (64): the later ones are given, not lent, and none is lost or
	// changed, neither while queued nor after the earlier ones closed.
	const many, mid = 70, 100 << 10
	for i := range many {
		if err := g0.Send(ctx, 1, 4, bytes.Repeat([]byte{byte(i)}, mid)); err != nil {
			t.Fatalf("queued send %d: %v", i, err)
		}
	}
	var open []*Message
	for i := range many {
		m, err := g1.Recv(ctx, 0, 4)
		if err != nil {
			t.Fatalf("queued message %d: %v", i, err)
		}
		if !bytes.Equal(m.Bytes(), bytes.Repeat([]byte{byte(i)}, mid)) {
			t.Fatalf("queued message %d: wrong bytes", i)
		}
		open = append(open, m)
	}
	for i, m := range open {
		if !bytes.Equal(m.Bytes(), bytes.Repeat([]byte{byte(i)}, mid)) {
			t.Fatalf("queued message %d changed while the others were received", i)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// A message dropped unread (its member leaves) goes back too.
	if err := g0.Send(ctx, 1, 3, held); err != nil {
		t.Fatal(err)
	}
	if err := g1.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g0.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*sidecar{a, b} {
		if left := s.leftBeyondPool(t, 16); len(left) != 0 {
			t.Fatalf("%s: left in shared memory: %v", s.shm, left)
		}
	}
}
