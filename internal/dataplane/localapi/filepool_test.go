package localapi

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
)

// getLent puts obj in pod a and gets it through pod b with a lent file,
// returning the file's path and the open object.
func getLent(t *testing.T, ctx context.Context, a, b *pod, obj []byte) (string, *Mapped) {
	t.Helper()
	r, err := a.sdk.Put(ctx, obj, 1)
	if err != nil {
		t.Fatal(err)
	}
	resp, m, err := b.sdk.GetMapped(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Mapped || m.token == "" {
		t.Fatalf("get of %d bytes: mapped %v, lent %q", len(obj), m.Mapped, m.token)
	}
	if !bytes.Equal(m.Data, obj) {
		t.Fatalf("get of %d bytes: wrong bytes", len(obj))
	}
	return resp.GetObject().GetPath(), m
}

// TestLentFilesAreReused: a file the function released is filled again by
// the next get, cut to the new object's size: its bytes are the new
// object's only (none of a previous, larger one past its end).
func TestLentFilesAreReused(t *testing.T) {
	bothSockets(t, func(t *testing.T, o podOpts) {
		a, b := startPod(t, o), startPod(t, o)
		ctx := context.Background()
		first := random(3<<20 + 5)
		path1, m := getLent(t, ctx, a, b, first)
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		second := random(1<<20 + 7)
		path2, m := getLent(t, ctx, a, b, second)
		defer m.Close()
		if path2 != path1 {
			t.Errorf("the released file was not reused: %s, then %s", path1, path2)
		}
		whole, err := os.ReadFile(path2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(whole, second) {
			t.Errorf("the reused file holds %d bytes, not just the %d of the new object", len(whole), len(second))
		}
	})
}

// TestOpenFilesAreNotRefilled: a file is filled again only after its
// reader released it; releases naming another lending of it, another
// file, or a path are ignored.
func TestOpenFilesAreNotRefilled(t *testing.T) {
	bothSockets(t, func(t *testing.T, o podOpts) {
		a, b := startPod(t, o), startPod(t, o)
		ctx := context.Background()
		x := random(2 << 20)
		pathX, mx := getLent(t, ctx, a, b, x)
		defer mx.Close()
		name, gen, _ := strings.Cut(mx.token, ":")
		forged := metadata.AppendToOutgoingContext(ctx, releaseKey, name+":9"+gen, releaseKey, "../"+name+":"+gen+",/etc/passwd:1,"+name)
		for i := 0; i < 3; i++ {
			y := random(2 << 20)
			r, err := a.sdk.Put(ctx, y, 1)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := b.sdk.RPC().Get(forged, &sidecarv1.GetRequest{Ref: r})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetObject().GetPath() == pathX {
				t.Fatal("a file still lent was filled again after a forged release")
			}
			_ = os.Remove(resp.GetObject().GetPath())
			_, my := getLent(t, ctx, a, b, y)
			if err := my.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(mx.Data, x) {
			t.Fatal("the open object's bytes changed")
		}
	})
}

// TestCallersThatDoNotBorrowOwnTheirFiles: a get without the lending
// request (the Python SDK, older clients) gets a file that is its own:
// the sidecar keeps nothing of it, and removing it leaves nothing behind.
func TestCallersThatDoNotBorrowOwnTheirFiles(t *testing.T) {
	a, b := startPod(t, podOpts{}), startPod(t, podOpts{})
	ctx := context.Background()
	obj := random(2 << 20)
	r, err := a.sdk.Put(ctx, obj, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.sdk.Get(ctx, r)
	if err != nil || !bytes.Equal(got, obj) {
		t.Fatalf("get: %d bytes, %v", len(got), err)
	}
	if left := entries(t, b.dir); len(left) != 0 {
		t.Errorf("files left: %v", left)
	}
	b.api.pool.mu.Lock()
	defer b.api.pool.mu.Unlock()
	if len(b.api.pool.lent)+len(b.api.pool.idle) != 0 {
		t.Errorf("the sidecar kept %d lent and %d idle files", len(b.api.pool.lent), len(b.api.pool.idle))
	}
}

// TestTamperedPoolFile: a function truncates or grows a file it released
// before the sidecar fills it again. The sidecar does not fill that file
// (nor crash): the get succeeds in a new one with the right bytes.
func TestTamperedPoolFile(t *testing.T) {
	for _, size := range []int64{0, 100, 4 << 20} {
		a, b := startPod(t, podOpts{}), startPod(t, podOpts{})
		ctx := context.Background()
		path1, m := getLent(t, ctx, a, b, random(2<<20))
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path1, size); err != nil {
			t.Fatal(err)
		}
		obj := random(2 << 20)
		path2, m := getLent(t, ctx, a, b, obj)
		if path2 == path1 {
			t.Errorf("resized to %d: the tampered file was filled again", size)
		}
		if _, err := os.Stat(path1); !os.IsNotExist(err) {
			t.Errorf("resized to %d: the tampered file was not removed (%v)", size, err)
		}
		m.Close()
	}
}

// TestStopRemovesPoolFiles: idle and lent files go with the sidecar; an
// open object stays readable.
func TestStopRemovesPoolFiles(t *testing.T) {
	a, b := startPod(t, podOpts{}), startPod(t, podOpts{})
	ctx := context.Background()
	_, m1 := getLent(t, ctx, a, b, random(2<<20))
	m1.Close()
	obj2 := random(3 << 20)
	_, m2 := getLent(t, ctx, a, b, obj2) // m1's file, grown: lent
	defer m2.Close()
	_, m3 := getLent(t, ctx, a, b, random(1<<20))
	m3.Close()
	_, small, err := b.sdk.GetMapped(ctx, mustPutT(t, a, []byte("small")))
	if err != nil {
		t.Fatal(err)
	}
	small.Close() // the call released m3's file: idle
	if n := len(entries(t, b.dir)); n != 2 {
		t.Fatalf("%d files in the directory, want a lent and an idle one", n)
	}
	b.api.Stop()
	if left := entries(t, b.dir); len(left) != 0 {
		t.Errorf("files left after Stop: %v", left)
	}
	if !bytes.Equal(m2.Data, obj2) {
		t.Error("an open object changed with Stop")
	}
}

func mustPutT(t *testing.T, p *pod, obj []byte) string {
	t.Helper()
	r, err := p.sdk.Put(context.Background(), obj, 1)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestReleaseWithAnyGet: a release rides on whatever get comes next, a
// small object of the pod's own included: the file is idle afterwards.
func TestReleaseWithAnyGet(t *testing.T) {
	bothSockets(t, func(t *testing.T, o podOpts) {
		a, b := startPod(t, o), startPod(t, o)
		ctx := context.Background()
		_, m := getLent(t, ctx, a, b, random(2<<20))
		m.Close()
		_, small, err := b.sdk.GetMapped(ctx, mustPutT(t, b, []byte("own, small")))
		if err != nil || string(small.Data) != "own, small" {
			t.Fatalf("small local get: %q, %v", small.Data, err)
		}
		b.api.pool.mu.Lock()
		defer b.api.pool.mu.Unlock()
		if len(b.api.pool.idle) != 1 || len(b.api.pool.lent) != 0 {
			t.Errorf("after the release: %d idle, %d lent files; want 1 idle", len(b.api.pool.idle), len(b.api.pool.lent))
		}
	})
}
