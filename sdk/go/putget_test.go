package ziptrail

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
)

func random(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestPutGetAcrossSidecars: a function in pod A puts objects, a function
// in pod B gets them through its own sidecar. Small objects come back
// inline, large ones as a mapping of a shared-memory file, reads are
// counted, and the package-level functions use the default client. What
// is left in the pods' directories is only the files kept for the next
// large objects (docs/dataplane.md, "Reused files"): at most one per pod,
// its put file given back to A's client, the file B's sidecar pulled into.
func TestPutGetAcrossSidecars(t *testing.T) {
	keys := keyFile(t, "k1", 1)
	a, b := startSidecar(t, sidecarOpts{keys: keys}), startSidecar(t, sidecarOpts{keys: keys})
	ctx := context.Background()

	small, big := []byte("a small object"), random(t, 3<<20)
	refSmall, err := a.client.Put(ctx, small, 1)
	if err != nil {
		t.Fatal(err)
	}
	refBig, err := a.client.Put(ctx, big, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(refBig, "zt1.") || strings.Contains(refBig, "127.0.0.1") {
		t.Errorf("a reference is opaque: %q", refBig)
	}

	obj, err := b.client.Get(ctx, refSmall)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(obj.Bytes(), small) || obj.Mapped() || obj.Source != "remote" {
		t.Errorf("small object: %q mapped=%t source=%q", obj.Bytes(), obj.Mapped(), obj.Source)
	}
	for i := range 2 { // two reads allowed
		obj, err := b.client.Get(ctx, refBig)
		if err != nil {
			t.Fatalf("read %d: %v", i+1, err)
		}
		if !obj.Mapped() || obj.Size != int64(len(big)) || !bytes.Equal(obj.Bytes(), big) {
			t.Fatalf("read %d: mapped=%t size=%d equal=%t", i+1, obj.Mapped(), obj.Size, bytes.Equal(obj.Bytes(), big))
		}
		if err := obj.Close(); err != nil || obj.Bytes() != nil {
			t.Fatalf("close: %v", err)
		}
	}
	if _, err := b.client.Get(ctx, refBig); !errors.Is(err, ErrExhausted) {
		t.Fatalf("a third read of a 2-read object: %v", err)
	}
	if left := a.shmFiles(t); len(left) > 1 || len(left) == 1 && !strings.HasPrefix(left[0], "put-") {
		t.Errorf("files left in the producer's directory: %v", left)
	}
	if left := b.shmFiles(t); len(left) > 1 || len(left) == 1 && !strings.HasPrefix(left[0], "get-") {
		t.Errorf("files left in the consumer's directory: %v", left)
	}

	// A buffer filled in place; then read back in the producer's own pod.
	buf, err := a.client.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf.Bytes(), big)
	ref, err := buf.Put(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := buf.Discard(); err != nil {
		t.Errorf("discard after put: %v", err)
	}
	local, err := a.client.Get(ctx, ref)
	if err != nil || local.Source != "local" || !bytes.Equal(local.Bytes(), big[:1<<20]) {
		t.Fatalf("local get of a buffer: %v (source %q)", err, local.Source)
	}
	local.Close()

	// Package-level calls go through the default client.
	old := SetDefault(b.client)
	defer SetDefault(old)
	ref, err = Put(ctx, small, 1)
	if err != nil {
		t.Fatal(err)
	}
	if obj, err := Get(ctx, ref); err != nil || string(obj.Bytes()) != string(small) || obj.Source != "local" {
		t.Fatalf("package-level round trip: %v", err)
	}
}

// TestGather gets many objects of two producers in parallel; one bad
// reference fails the whole gather with that reference's error.
func TestGather(t *testing.T) {
	keys := keyFile(t, "k1", 2)
	a, b, c := startSidecar(t, sidecarOpts{keys: keys}), startSidecar(t, sidecarOpts{keys: keys}), startSidecar(t, sidecarOpts{keys: keys})
	ctx := context.Background()
	var objs [][]byte
	var refs []string
	for i := range 8 {
		obj := random(t, (i+1)*100<<10)
		producer := a
		if i%2 == 1 {
			producer = b
		}
		ref, err := producer.client.Put(ctx, obj, 1)
		if err != nil {
			t.Fatal(err)
		}
		objs, refs = append(objs, obj), append(refs, ref)
	}
	got, err := c.client.Gather(ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range got {
		if !bytes.Equal(o.Bytes(), objs[i]) {
			t.Errorf("object %d differs", i)
		}
		o.Close()
	}
	// All were read once: a second gather is refused.
	if _, err := c.client.Gather(ctx, refs[:2]); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "#1") {
		t.Errorf("second gather: %v", err)
	}
}

// digest is a function that answers with its input's size, digest and
// name, and refuses inputs that were not mapped.
func digest(ctx context.Context, inv *Invocation) ([]byte, error) {
	if len(inv.Objects) != 1 {
		return nil, fmt.Errorf("want one input, got %d", len(inv.Objects))
	}
	o := inv.Objects[0]
	if len(o.Bytes()) > 4096 && !o.Mapped() {
		return nil, errors.New("a large input must be mapped from shared memory, not copied")
	}
	if err := SendObject(ctx, "seen", inv.Function, []byte(o.Key), map[string]string{MetaGroup: "g"}); err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "%d:%s:%s/%s:%s", len(o.Bytes()), sum(o.Bytes()), o.Bucket, o.Key, inv.Args), nil
}

// TestInvoke100MB: a function in pod A invokes, by URL, a Go function
// (FunctionHandler) behind pod B's sidecar with a 100 MB object; B's
// sidecar pulls it from A, the function reads it mapped, not copied.
func TestInvoke100MB(t *testing.T) {
	keys := keyFile(t, "k1", 3)
	shm := functionShm(t)
	fn := httptest.NewServer(FunctionHandler(digest))
	defer fn.Close()
	a, b := startSidecar(t, sidecarOpts{keys: keys}), startSidecar(t, sidecarOpts{keys: keys, upstream: fn.URL, shm: shm})
	obj := random(t, 100<<20)
	resp, err := a.client.Invoke(context.Background(), b.url(), obj, WithObjectName("chunks", "big"), WithFunction("digest"), WithArgs([]byte("x")))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d:%s:chunks/big:x", len(obj), sum(obj)); string(resp.Body) != want {
		t.Fatalf("function answered %q, want %q", resp.Body, want)
	}
	if len(resp.Outputs) != 1 || resp.Outputs[0].Bucket != "seen" || string(resp.Outputs[0].Inline) != "big" || resp.Outputs[0].Metadata[MetaGroup] != "g" {
		t.Errorf("outputs %+v", resp.Outputs)
	}
}

// TestScatterBroadcast: scatter puts each object once for its own call;
// broadcast puts one object for as many reads as callees, in two pods.
func TestScatterBroadcast(t *testing.T) {
	keys := keyFile(t, "k1", 4)
	shmB := functionShm(t)
	fnB := httptest.NewServer(FunctionHandler(digest))
	defer fnB.Close()
	shmC := functionShm(t)
	fnC := httptest.NewServer(FunctionHandler(digest))
	defer fnC.Close()
	a := startSidecar(t, sidecarOpts{keys: keys})
	b, c := startSidecar(t, sidecarOpts{keys: keys, upstream: fnB.URL, shm: shmB}), startSidecar(t, sidecarOpts{keys: keys, upstream: fnC.URL, shm: shmC})
	ctx := context.Background()

	objs := [][]byte{random(t, 10), random(t, 1<<20), random(t, 2<<20), random(t, 100)}
	resps, err := a.client.Scatter(ctx, b.url(), objs, WithFunction("map"))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resps {
		if !strings.HasPrefix(string(r.Body), fmt.Sprintf("%d:%s:input/", len(objs[i]), sum(objs[i]))) {
			t.Errorf("scatter %d: %q", i, r.Body)
		}
	}
	if _, err := a.client.ScatterTo(ctx, []string{b.url()}, objs); !errors.Is(err, ErrInvalid) {
		t.Errorf("mismatched scatter: %v", err)
	}

	obj := random(t, 5<<20)
	resps, err = a.client.Broadcast(ctx, []string{b.url(), c.url(), b.url()}, obj, WithObjectName("model", "weights"))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d:%s:model/weights:", len(obj), sum(obj))
	for i, r := range resps {
		if string(r.Body) != want {
			t.Errorf("broadcast %d: %q, want %q", i, r.Body, want)
		}
	}
}
