package localapi

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
)

// idlePutFiles lists the put files a client holds, given back.
func idlePutFiles(c *Client) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	for _, pf := range c.putIdle {
		names = append(names, pf.name)
	}
	return names
}

// TestPutFilesGoBackToTheirClient: a put's file keeps its name while the
// object lives, goes back to the client that put it once the object is
// freed — not while a read still uses it — and holds the next object
// (cut to its size). Another client of the pod never gets it.
func TestPutFilesGoBackToTheirClient(t *testing.T) {
	a, b := startPod(t, podOpts{}), startPod(t, podOpts{})
	ctx := context.Background()
	first := random(3<<20 + 11)
	r1 := mustPutT(t, a, first)
	names := entries(t, a.dir)
	if len(names) != 1 {
		t.Fatalf("directory after a put: %v", names)
	}
	lease, ok := a.api.Store.Hold(a.api.Store.Unread()[0].ID)
	if !ok {
		t.Fatal("object not stored")
	}
	if got, err := b.sdk.Get(ctx, r1); err != nil || !bytes.Equal(got, first) {
		t.Fatalf("get: %d bytes, %v", len(got), err)
	}
	// Read as often as allowed, but a read (the lease) still uses it.
	other, err := Dial(a.sdk.conn.Target()[len("unix://"):], a.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	mustPutC(t, other, random(2<<20))
	mustPutT(t, a, random(2<<20))
	if slices.Contains(idlePutFiles(a.sdk), names[0]) {
		t.Fatal("the file went back while a read still used its object")
	}
	lease.Release() // the last read: the object is freed now
	mustPutC(t, other, random(2<<20))
	if slices.Contains(idlePutFiles(other), names[0]) {
		t.Fatal("another client got the file back")
	}
	mustPutT(t, a, random(1<<20)) // its answer gives the file back
	if !slices.Contains(idlePutFiles(a.sdk), names[0]) {
		t.Fatalf("the file did not go back to its client: idle %v", idlePutFiles(a.sdk))
	}
	third := random(1<<20 + 5)
	r3 := mustPutT(t, a, third) // into the file given back
	st, err := os.Stat(filepath.Join(a.dir, names[0]))
	if err != nil || st.Size() != int64(len(third)) {
		t.Fatalf("the reused file: %v, %v; want %d bytes", st, err, len(third))
	}
	if got, err := b.sdk.Get(ctx, r3); err != nil || !bytes.Equal(got, third) {
		t.Fatalf("get from the reused file: %d bytes, %v", len(got), err)
	}
}

// TestPutFilesOfOtherClientsAreRemoved: a put without a valid client id
// is taken over as before (its name removed at once); a name the sidecar
// gives back that a client did not hand over is removed, not reused.
func TestPutFilesOfOtherClientsAreRemoved(t *testing.T) {
	a := startPod(t, podOpts{})
	ctx := context.Background()
	for _, id := range []string{"", "../x", "a,b", "a b"} {
		p, err := a.sdk.Payload(random(2 << 20))
		if err != nil {
			t.Fatal(err)
		}
		mctx := metadata.AppendToOutgoingContext(ctx, lendKey, lendValue, clientKey, id)
		if _, err := a.sdk.RPC().Put(mctx, &sidecarv1.PutRequest{Object: p, Reads: 1}); err != nil {
			t.Fatal(err)
		}
		if left := entries(t, a.dir); len(left) != 0 {
			t.Errorf("client id %q: the file kept its name: %v", id, left)
		}
	}
	stranger := filepath.Join(a.dir, "stranger")
	if err := os.WriteFile(stranger, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	a.sdk.takeBack([]string{"stranger"})
	if len(idlePutFiles(a.sdk)) != 0 {
		t.Error("a file the client never handed over became reusable")
	}
	if _, err := os.Stat(stranger); !os.IsNotExist(err) {
		t.Errorf("a name given back that the client never handed over was not removed: %v", err)
	}
}

func mustPutC(t *testing.T, c *Client, obj []byte) string {
	t.Helper()
	r, err := c.Put(context.Background(), obj, 1)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
