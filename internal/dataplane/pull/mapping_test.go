package pull

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"syscall"
	"testing"
)

// mapped makes a file of size bytes with a shared writable mapping, as a
// consumer that reuses its files does.
func mapped(t *testing.T, size int) *Mapping {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "dst-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	return &Mapping{File: f, Mem: mem}
}

// TestPullIntoMapping: the object lands in the consumer's mapped file,
// whole (the bytes the stream buffered with the header included).
func TestPullIntoMapping(t *testing.T) {
	objs := map[string][]byte{"odd": random(3*256<<10 + 17), "small": random(100)}
	_, refs := startProducer(t, objs, 1)
	c := &Client{Keys: keys(t, "ns")}
	defer c.Close()
	for id, want := range objs {
		dst := mapped(t, len(want))
		if _, err := c.PullTo(context.Background(), refs[id], func(int64) (io.WriterAt, error) { return dst, nil }); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if !bytes.Equal(dst.Mem, want) {
			t.Errorf("%s: wrong bytes in the mapping", id)
		}
	}
}

// TestPullIntoTruncatedMapping: someone truncates the consumer's file
// under its mapping (a function with the file open). The pull fails with
// an error naming the destination; the consumer's process does not fault.
func TestPullIntoTruncatedMapping(t *testing.T) {
	_, refs := startProducer(t, map[string][]byte{"big": random(8 << 20)}, 1)
	c := &Client{Keys: keys(t, "ns")}
	defer c.Close()
	dst := mapped(t, 8<<20)
	if err := dst.File.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	_, err := c.PullTo(context.Background(), refs["big"], func(int64) (io.WriterAt, error) { return dst, nil })
	if err == nil || errors.Is(err, ErrProducerGone) {
		t.Fatalf("pull into a truncated mapping: %v, want the destination's error", err)
	}
	t.Logf("pull saw: %v", err)
}
