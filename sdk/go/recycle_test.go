package ziptrail

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
)

func TestRecyclerClasses(t *testing.T) {
	for _, c := range []struct{ n, class, size int }{
		{minRecycled, 0, 16 << 10}, {minRecycled + 1, 1, 32 << 10}, {1000000, 6, 1 << 20},
		{1 << 20, 6, 1 << 20}, {directmsg.CopyMax, nClasses - 1, directmsg.CopyMax},
	} {
		if class, size := class(c.n); class != c.class || size != c.size {
			t.Errorf("class(%d) = %d, %d; want %d, %d", c.n, class, size, c.class, c.size)
		}
	}
	r := newRecycler()
	for _, c := range []struct {
		tag int64
		n   int
	}{{-3, 1 << 20}, {0, minRecycled - 1}, {0, directmsg.CopyMax + 1}} {
		if b := r.get(c.tag, c.n); b != nil {
			t.Errorf("get(%d, %d) recycled a buffer: collectives' messages and sizes out of range keep their own", c.tag, c.n)
		}
	}
	b := r.get(1, 1000000)
	if len(b) != 1000000 || cap(b) != 1<<20 || r.out != 1<<20 {
		t.Fatalf("get: len %d cap %d, out %d", len(b), cap(b), r.out)
	}
	r.put(b)
	if b2 := r.get(1, 600000); &b2[0] != &b[0] || r.out != 1<<20 {
		t.Fatal("a buffer given back was not reused for the next message of its class")
	}
}

// TestDirectRecycledBuffers: with WithRecycledBuffers, messages of every
// size arrive whole over a direct channel; those of 16 KiB to 4 MiB reuse
// the buffers Close gave back; messages never closed hold at most 64 MiB
// before new ones get buffers of their own, whole as well.
func TestDirectRecycledBuffers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gs := twoOnANode(t, ctx, WithRecycledBuffers())
	sizes := []int{100, 20 << 10, 1 << 20, 1000000, 3 << 20, 6 << 20, 64 << 10}
	payload := func(i, n int) []byte {
		d := make([]byte, n)
		for j := range d {
			d[j] = byte(i + j*13)
		}
		return d
	}
	for i := range 70 {
		n := sizes[i%len(sizes)]
		if err := gs[0].Send(ctx, 1, int64(i), payload(i, n)); err != nil {
			t.Fatal(err)
		}
		m, err := gs[1].Recv(ctx, 0, int64(i))
		if err != nil || !bytes.Equal(m.Bytes(), payload(i, n)) {
			t.Fatalf("message %d of %d bytes: %v", i, n, err)
		}
		recycled := m.rec != nil
		if recycled != (n >= minRecycled && n <= directmsg.CopyMax) {
			t.Errorf("message %d of %d bytes: recycled %v", i, n, recycled)
		}
		m.Close()
		if recycled && m.Bytes() != nil {
			t.Fatal("Bytes of a recycled message after Close")
		}
	}
	rec := gs[1].att.rec
	rec.mu.Lock()
	out, kept := rec.out, 0
	for _, f := range rec.free {
		kept += len(f)
	}
	rec.mu.Unlock()
	if out != 0 || kept == 0 || kept > nClasses*recycledKeep {
		t.Fatalf("after every message closed: %d bytes out, %d buffers kept", out, kept)
	}
	allDirect(t, gs[:1])

	// Never closed: past 64 MiB, buffers of their own.
	var held []*Message
	for i := range 80 {
		if err := gs[0].Send(ctx, 1, 7, payload(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
		m, err := gs[1].Recv(ctx, 0, 7)
		if err != nil {
			t.Fatal(err)
		}
		if (m.rec != nil) != (i < maxRecycledOut>>20) {
			t.Fatalf("unclosed message %d: recycled %v", i, m.rec != nil)
		}
		held = append(held, m)
	}
	for i, m := range held {
		if !bytes.Equal(m.Bytes(), payload(i, 1<<20)) {
			t.Fatalf("unclosed message %d changed", i)
		}
		m.Close()
	}
}
