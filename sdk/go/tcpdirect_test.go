package ziptrail

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestTCPChannelsAcrossPods: two pods on different nodes (no node
// directory between them) talk over direct TCP channels in both
// directions; messages of every size arrive whole and in order; a
// receiver that reads nothing holds its sender back (a send times out
// before its frame starts: nothing is cut, nothing lost); a member that
// leaves is PeerGone to the other, for its receives and its sends.
func TestTCPChannelsAcrossPods(t *testing.T) {
	op := servers.StartOperator(t)
	a, b := startPod(t, op, "ns", "pod-a"), startPod(t, op, "ns", "pod-b")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gs := joinAll(t, ctx, []*sidecar{a, b}, "s1", "tcp", 2)
	sizes := []int{0, 1, 100, 64 << 10, 200 << 10, 5 << 20, 70 << 20}
	errs := eachMember(gs, func(g *Group) error {
		other := 1 - g.Rank()
		for i, n := range sizes {
			if err := g.Send(ctx, other, int64(i), bytes.Repeat([]byte{byte(i + g.Rank())}, n)); err != nil {
				return err
			}
		}
		for i, n := range sizes {
			m, err := g.Recv(ctx, other, AnyTag)
			if err != nil {
				return err
			}
			if m.Tag != int64(i) || !bytes.Equal(m.Bytes(), bytes.Repeat([]byte{byte(i + other)}, n)) {
				t.Errorf("rank %d, message %d: tag %d, %d bytes", g.Rank(), i, m.Tag, len(m.Bytes()))
			}
			m.Close()
		}
		return nil
	})
	checkAll(t, "every size", errs)
	pathsAre(t, gs, true, func(r int) int { return r })
	for _, g := range gs {
		g.att.mu.Lock()
		ic := g.att.in[1-g.Rank()]
		g.att.mu.Unlock()
		if ic == nil || ic.c == nil || !ic.c.Stream() {
			t.Fatalf("rank %d did not receive over a TCP channel", g.Rank())
		}
	}

	// Back-pressure: rank 1 reads nothing until rank 0 is held back.
	holdBack(t, ctx, gs[0], gs[1], 1<<20)

	// Rank 1 sends 24 MiB and leaves at once: its last frames still
	// arrive (a TCP socket closed with a credit unread would reset the
	// connection and drop what it had not transmitted), then rank 0's
	// receives from it and its sends to it fail with PeerGone.
	const last = 24
	for i := range last {
		if err := gs[1].Send(ctx, 0, 9, bytes.Repeat([]byte{byte(i)}, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	if err := gs[1].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range last {
		m, err := gs[0].Recv(ctx, 1, 9)
		if err != nil || len(m.Bytes()) != 1<<20 || m.Bytes()[0] != byte(i) {
			t.Fatalf("message %d sent before the leave: %v", i, err)
		}
		m.Close()
	}
	if _, err := gs[0].Recv(ctx, 1, AnyTag); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("recv from a rank that left: %v, want PeerGone", err)
	}
	var err error
	for range 1000 {
		if err = gs[0].Send(ctx, 1, 0, make([]byte, 60<<10)); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send to a rank that left: %v, want PeerGone", err)
	}
}
