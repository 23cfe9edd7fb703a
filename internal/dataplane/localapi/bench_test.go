package localapi

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
)

// BenchmarkPutGet is one object through the SDK path end to end: put in
// pod A's sidecar (file in shared memory, gRPC over the unix socket), get
// in pod B's (pulled over Cap'n Proto into a shared-memory file), read by
// the function.
func BenchmarkPutGet(b *testing.B) {
	for _, size := range []int{10 << 10, 1 << 20, 10 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			a, c := startPod(b, podOpts{dir: shmDir(b)}), startPod(b, podOpts{dir: shmDir(b)})
			// The pod default: objects up to 64 KiB travel inline in the
			// gRPC messages, larger ones as shared-memory files.
			for _, p := range []*pod{a, c} {
				p.api.InlineThreshold, p.sdk.InlineThreshold = 64<<10, 64<<10
			}
			obj := random(size)
			ctx := context.Background()
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, err := a.sdk.Put(ctx, obj, 1)
				if err != nil {
					b.Fatal(err)
				}
				got, err := c.sdk.Get(ctx, r)
				if err != nil || len(got) != size {
					b.Fatalf("get: %d bytes, %v", len(got), err)
				}
			}
			b.StopTimer()
			if got, _ := c.sdk.Get(ctx, mustPut(b, a, obj)); !bytes.Equal(got, obj) {
				b.Fatal("object corrupted")
			}
		})
	}
}

func mustPut(b *testing.B, p *pod, obj []byte) string {
	r, err := p.sdk.Put(context.Background(), obj, 1)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// shmDir is a directory in /dev/shm (tmpfs, as a pod's emptyDir with
// medium Memory), else a temp dir.
func shmDir(b *testing.B) string {
	dir, err := os.MkdirTemp("/dev/shm", "ztbench")
	if err != nil {
		return b.TempDir()
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
