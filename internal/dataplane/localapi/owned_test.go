package localapi

import (
	"bytes"
	"context"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// TestPutKeepsTheFileAsStorage: a put's shared-memory file becomes the
// object's storage (mapped, not read into the sidecar's heap): counted
// against the store's cap, its name gone from the directory at once (for
// a client that does not take files back, as the Python SDK), and
// unmapped when the object is freed.
func TestPutKeepsTheFileAsStorage(t *testing.T) {
	a, b := startPod(t, podOpts{}), startPod(t, podOpts{})
	ctx := context.Background()
	obj := random(3 << 20)
	p, err := a.sdk.Payload(obj)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.sdk.RPC().Put(ctx, &sidecarv1.PutRequest{Object: p, Reads: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetRef()
	if left := entries(t, a.dir); len(left) != 0 {
		t.Errorf("files left in the object directory: %v", left)
	}
	if a.api.Store.Used() != int64(len(obj)) {
		t.Errorf("store counts %d bytes, want %d", a.api.Store.Used(), len(obj))
	}
	unread := a.api.Store.Unread()
	if len(unread) != 1 {
		t.Fatalf("%d objects stored", len(unread))
	}
	h, ok := a.api.Store.Hold(unread[0].ID)
	if !ok || !h.Owned() {
		t.Fatal("the object is not the mapped file")
	}
	h.Release()
	got, err := b.sdk.Get(ctx, r)
	if err != nil || !bytes.Equal(got, obj) {
		t.Fatalf("get: %d bytes, %v", len(got), err)
	}
	if a.api.Store.Used() != 0 || a.api.Store.Len() != 0 {
		t.Errorf("after its only read the object still holds %d bytes", a.api.Store.Used())
	}
}

// TestTruncatedPutFile: a function hands its file over, keeps it open
// and truncates it. The sidecar does not crash: a consumer's get fails
// with an error, a copy for a tier fails with an error, and the pod's
// other objects are served as before.
func TestTruncatedPutFile(t *testing.T) {
	a, b := startPod(t, podOpts{}), startPod(t, podOpts{})
	ctx := context.Background()
	f, err := os.CreateTemp(a.dir, "put-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(random(4 << 20)); err != nil {
		t.Fatal(err)
	}
	resp, err := a.sdk.RPC().Put(ctx, &sidecarv1.PutRequest{Object: pathPayload(f.Name()), Reads: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	h, ok := a.api.Store.Hold(a.api.Store.Unread()[0].ID)
	if !ok {
		t.Fatal("object gone")
	}
	if _, err := store.Clone(h.Data); err == nil {
		t.Error("copying the truncated object succeeded")
	}
	h.Release()
	if got, err := b.sdk.Get(ctx, resp.GetRef()); err == nil {
		t.Errorf("get of the truncated object: %d bytes, no error", len(got))
	} else {
		t.Logf("consumer saw: %v", err)
	}
	if left := entries(t, b.dir); len(left) != 0 {
		t.Errorf("the failed get left files in the consumer's directory: %v", left)
	}
	good := random(2 << 20)
	r, err := a.sdk.Put(ctx, good, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.sdk.Get(ctx, r); err != nil || !bytes.Equal(got, good) {
		t.Fatalf("another object after the truncation: %d bytes, %v", len(got), err)
	}
}

// TestPutFilesDoNotFillASmallShm: the shared-memory directory is a small
// tmpfs, as a pod's /dev/shm is (64 MiB by default, here 16 MiB), and a
// client that does not take its files back (the Python SDK's way) puts
// far more than that. Every put succeeds and every object reads back:
// past half of the tmpfs, the sidecar reads a put's file into its memory
// and removes it instead of keeping it mapped. Before, the kept files
// filled the tmpfs and the client's sixth write failed with ENOSPC (the
// sort benchmark's "No space left on device").
func TestPutFilesDoNotFillASmallShm(t *testing.T) {
	dir := smallShm(t)
	a, b := startPod(t, podOpts{dir: dir}), startPod(t, podOpts{})
	ctx := context.Background()
	var objs [][]byte
	var refs []string
	for i := range 12 { // 36 MiB through a 16 MiB tmpfs
		obj := random(3 << 20)
		p, err := a.sdk.Payload(obj)
		if err != nil {
			t.Fatalf("put %d: writing its file: %v", i, err)
		}
		resp, err := a.sdk.RPC().Put(ctx, &sidecarv1.PutRequest{Object: p, Reads: 1})
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		objs, refs = append(objs, obj), append(refs, resp.GetRef())
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if used := (st.Blocks - st.Bavail) * uint64(st.Bsize); used > 8<<20+3<<20 {
		t.Errorf("%d bytes of the tmpfs used with every object stored; want at most half and one object", used)
	}
	if a.api.Store.Used() != 36<<20 {
		t.Errorf("store counts %d bytes, want %d", a.api.Store.Used(), 36<<20)
	}
	for i, r := range refs {
		got, err := b.sdk.Get(ctx, r)
		if err != nil || !bytes.Equal(got, objs[i]) {
			t.Fatalf("get %d: %d bytes, %v", i, len(got), err)
		}
	}
}

// The Go SDK's puts lend their files (PutObject: the file comes back to
// the client once the object is freed, for its next put). Those files
// held the tmpfs as long as their objects lived, so a pod's 64 MiB
// /dev/shm filled after a few puts and the function's next write failed
// (ENOSPC). Past half full, the sidecar now reads them too, and the
// client lets their mappings go.
func TestLentPutFilesDoNotFillASmallShm(t *testing.T) {
	dir := smallShm(t)
	a, b := startPod(t, podOpts{dir: dir}), startPod(t, podOpts{})
	ctx := context.Background()
	var objs [][]byte
	var refs []string
	for i := range 12 { // 36 MiB through a 16 MiB tmpfs, every object live
		obj := random(3 << 20)
		resp, err := a.sdk.PutObject(ctx, obj, &sidecarv1.PutRequest{Reads: 1})
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		objs, refs = append(objs, obj), append(refs, resp.GetRef())
	}
	// one more call: the client hears which files went back
	if _, err := a.sdk.PutObject(ctx, []byte("small"), &sidecarv1.PutRequest{Reads: 1}); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if used := (st.Blocks - st.Bavail) * uint64(st.Bsize); used > 8<<20+3<<20 {
		t.Errorf("%d bytes of the tmpfs used with every object stored; want at most half and one object", used)
	}
	for i, r := range refs {
		got, err := b.sdk.Get(ctx, r)
		if err != nil || !bytes.Equal(got, objs[i]) {
			t.Fatalf("get %d: %d bytes, %v", i, len(got), err)
		}
	}
}

// smallShm mounts a real 16 MiB tmpfs, a pod's /dev/shm in small.
func smallShm(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("shm", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=16m"); err != nil {
		t.Fatalf("mount a tmpfs (the tests run as root, as the node agent's do): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}
