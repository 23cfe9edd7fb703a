package localapi

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

var benchSizes = []int{10 << 10, 1 << 20, 10 << 20}

// BenchmarkPutGet is one object through the SDK path end to end: put in
// pod A's sidecar (a small object in one object-socket message, a large
// one as a file in shared memory, which becomes the object's storage),
// get in pod B's (pulled from A, small ones answered in the message,
// large ones straight into a shared-memory file), mapped by the function
// as the Go SDK does.
func BenchmarkPutGet(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) { benchPutGet(b, size, MemfdAuto) })
	}
}

// BenchmarkPutGetGRPC is BenchmarkPutGet with every put and get a gRPC
// call (as an SDK does against a sidecar without the object socket's
// ops 4 and 5): the path objbytes.go replaced, side by side.
func BenchmarkPutGetGRPC(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) { benchPutGet(b, size, MemfdNever) })
	}
}

func benchPutGet(b *testing.B, size int, mode MemfdMode) {
	a, c := benchPods(b)
	a.sdk.Memfds, c.sdk.Memfds = mode, mode
	obj := random(size)
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ResetTimer()
	cpuDone := reportCPU(b)
	for i := 0; i < b.N; i++ {
		r, err := a.sdk.Put(ctx, obj, 1)
		if err != nil {
			b.Fatal(err)
		}
		if err := getMapped(ctx, c.sdk, r, func(got []byte) error {
			if len(got) != size {
				return fmt.Errorf("got %d bytes", len(got))
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	cpuDone()
	b.StopTimer()
	if err := getMapped(ctx, c.sdk, mustPut(b, a, obj), func(got []byte) error {
		if !bytes.Equal(got, obj) {
			return fmt.Errorf("object corrupted")
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAllocPutGet is BenchmarkPutGet with the object produced in
// place: the function writes it into an Alloc'd buffer (a file the
// sidecar gave back, through the mapping the client kept) before the
// timer runs, as BenchmarkBarePull's object is in the producer's memory
// before its; timed (wall and CPU): the buffer's put (no copy) and the
// get.
func BenchmarkAllocPutGet(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			a, c := benchPods(b)
			obj := random(size)
			ctx := context.Background()
			b.SetBytes(int64(size))
			var cpu time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				buf, err := a.sdk.Alloc(ctx, size)
				if err != nil {
					b.Fatal(err)
				}
				copy(buf.Data, obj)
				b.StartTimer()
				start := cpuTime()
				resp, err := buf.Put(ctx, &sidecarv1.PutRequest{Reads: 1})
				if err != nil {
					b.Fatal(err)
				}
				if err := getMapped(ctx, c.sdk, resp.GetRef(), func(got []byte) error {
					if len(got) != size || got[size-1] != obj[size-1] {
						return fmt.Errorf("got %d bytes", len(got))
					}
					touch(got) // the function reads its object
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				cpu += cpuTime() - start
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkBarePull is the same object moved without the SDK: stored in
// pod A's memory by the sidecar itself, pulled by pod B's sidecar into
// its memory (the baseline BenchmarkPutGet is held to).
func BenchmarkBarePull(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			a, _ := benchPods(b)
			kr, _ := a.api.KeySource.Keys(context.Background())
			client := &pull.Client{Keys: kr}
			defer client.Close()
			obj := random(size)
			ctx := context.Background()
			b.SetBytes(int64(size))
			b.ResetTimer()
			defer reportCPU(b)()
			for i := 0; i < b.N; i++ {
				id := fmt.Sprint("bare-", i)
				exp := time.Now().Add(time.Minute)
				if err := a.api.Store.Put(ctx, store.Meta{ID: id, Reads: 1, Expires: exp}, obj); err != nil {
					b.Fatal(err)
				}
				r, err := kr.Seal(ref.Record{Addr: a.api.Addr, Key: id, Expires: exp, Reads: 1})
				if err != nil {
					b.Fatal(err)
				}
				got, _, err := client.Pull(ctx, r)
				if err != nil || len(got) != size {
					b.Fatalf("pull: %d bytes, %v", len(got), err)
				}
			}
		})
	}
}

// reportCPU reports the process's CPU time (user + system, both pods and
// the function) per operation: on a shared machine it varies less than
// the wall time. Call the returned function at the end of the loop.
func reportCPU(b *testing.B) func() {
	cpu := cpuTime
	start := cpu()
	return func() {
		b.ReportMetric(float64((cpu()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

var sink byte

// touch reads a byte of every page, as a function reading its object
// does (a lazily mapped file then pays its faults here).
func touch(b []byte) {
	for i := 0; i < len(b); i += 4096 {
		sink ^= b[i]
	}
}

// cpuTime is the process's CPU time so far (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchPods(b *testing.B) (*pod, *pod) {
	a, c := startPod(b, podOpts{dir: shmDir(b)}), startPod(b, podOpts{dir: shmDir(b)})
	// The pod default: objects up to 64 KiB travel inline (on the object
	// socket, which a sidecar always serves), larger ones as
	// shared-memory files.
	for _, p := range []*pod{a, c} {
		p.api.InlineThreshold, p.sdk.InlineThreshold = 64<<10, 64<<10
		serveObjects(b, p)
	}
	return a, c
}

// getMapped gets an object as the SDKs do: inline bytes, or a mapping of
// the file the sidecar pulled it into (lent, released on close).
func getMapped(ctx context.Context, c *Client, r string, use func([]byte) error) error {
	_, m, err := c.GetMapped(ctx, r)
	if err != nil {
		return err
	}
	defer m.Close()
	return use(m.Data)
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
