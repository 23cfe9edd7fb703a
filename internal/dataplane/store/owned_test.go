package store

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestOwnedObjects: an object whose bytes live outside the heap (a mapped
// file) counts against the cap, and its storage is released exactly once,
// when it is freed — after its last read, on expiry, on session GC — and
// not while a read or a hold still has it.
func TestOwnedObjects(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := New(100, c.now)
	ctx := context.Background()
	freed := map[string]int{}
	put := func(id, session string, reads uint32, size int) {
		t.Helper()
		if err := s.PutOwned(ctx, Meta{ID: id, Session: session, Reads: reads, Expires: c.t.Add(time.Minute)}, make([]byte, size), func() { freed[id]++ }); err != nil {
			t.Fatal(err)
		}
	}
	put("read-once", "s1", 1, 30)
	put("held", "s1", 1, 30)
	put("gc", "s2", 5, 30)
	if s.Used() != 90 {
		t.Fatalf("used %d, want 90", s.Used())
	}
	// Over the cap: refused (the caller keeps its bytes and frees them).
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := s.PutOwned(short, Meta{ID: "big", Reads: 1}, make([]byte, 20), func() { freed["big"]++ }); err == nil {
		t.Fatal("a put over the cap succeeded")
	}
	l, err := s.Read("read-once")
	if err != nil {
		t.Fatal(err)
	}
	if freed["read-once"] != 0 {
		t.Fatal("freed while its read is under way")
	}
	l.Release()
	h, ok := s.Hold("held")
	if !ok || !h.Owned() {
		t.Fatal("hold of an owned object")
	}
	s.DropSession("s1")
	if freed["held"] != 0 {
		t.Fatal("freed while held")
	}
	h.Release()
	s.DropSession("s2")
	for _, id := range []string{"read-once", "held", "gc"} {
		if freed[id] != 1 {
			t.Errorf("%s freed %d times, want 1", id, freed[id])
		}
	}
	if freed["big"] != 0 || s.Used() != 0 {
		t.Errorf("refused object freed %d times by the store; used %d", freed["big"], s.Used())
	}
	// Expiry frees too.
	put("ttl", "", 1, 10)
	c.t = c.t.Add(time.Hour)
	s.Sweep()
	if freed["ttl"] != 1 {
		t.Errorf("expired object freed %d times", freed["ttl"])
	}
}

// TestCloneOfATruncatedMapping: the function that handed its file over
// truncates it; copying the object's bytes is an error, not a SIGBUS.
func TestCloneOfATruncatedMapping(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "obj"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 1 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	if got, err := Clone(mem); err != nil || len(got) != size {
		t.Fatalf("clone of an intact mapping: %d bytes, %v", len(got), err)
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := Clone(mem); err == nil {
		t.Fatal("clone of a truncated mapping succeeded")
	}
}
