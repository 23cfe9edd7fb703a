package pull

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

var testKey = bytes.Repeat([]byte{7}, 32)

func keys(t testing.TB, ns string) *ref.Keyring {
	k, err := ref.NewKeyring(ns, map[string][]byte{"k1": testKey}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// startProducer starts a Server on loopback holding the given objects.
// opts set the Server's limits before it serves (setting them later races
// with its connections).
func startProducer(t testing.TB, objs map[string][]byte, reads uint32, opts ...func(*Server)) (*Server, map[string]string) {
	s := &Server{Store: store.New(4<<30, nil), Keys: keys(t, "ns")}
	for _, o := range opts {
		o(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln // for putRef, before Serve sets it
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	refs := map[string]string{}
	for id, data := range objs {
		exp := time.Now().Add(time.Hour)
		if err := s.Store.Put(context.Background(), store.Meta{ID: id, Bucket: "b", Key: id, Reads: reads, Expires: exp}, data); err != nil {
			t.Fatal(err)
		}
		r, err := s.Keys.Seal(ref.Record{Addr: ln.Addr().String(), Key: id, Expires: exp, Reads: reads})
		if err != nil {
			t.Fatal(err)
		}
		refs[id] = r
	}
	return s, refs
}

func random(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func TestPullSizesAndReads(t *testing.T) {
	objs := map[string][]byte{"empty": {}, "small": []byte("hi"), "odd": random(3*256<<10 + 17), "ten": random(10 << 20)}
	_, refs := startProducer(t, objs, 2)
	c := &Client{Keys: keys(t, "ns")}
	defer c.Close()
	ctx := context.Background()
	for id, want := range objs {
		for i := 0; i < 2; i++ {
			got, info, err := c.Pull(ctx, refs[id])
			if err != nil {
				t.Fatalf("%s read %d: %v", id, i, err)
			}
			if !bytes.Equal(got, want) || info.Size != int64(len(want)) || info.Key != id {
				t.Fatalf("%s read %d: %d bytes, info %+v", id, i, len(got), info)
			}
		}
		if _, _, err := c.Pull(ctx, refs[id]); !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrExhausted) {
			t.Errorf("%s third read: %v, want not found/exhausted", id, err)
		}
	}
}

func TestBadReferenceClasses(t *testing.T) {
	_, refs := startProducer(t, map[string][]byte{"o": []byte("x")}, 1)
	ctx := context.Background()
	c := &Client{Keys: keys(t, "ns")}
	defer c.Close()
	tampered := []byte(refs["o"])
	if tampered[len(tampered)-5] == 'A' { // another valid base64url character
		tampered[len(tampered)-5] = 'B'
	} else {
		tampered[len(tampered)-5] = 'A'
	}
	if _, _, err := c.Pull(ctx, string(tampered)); !errors.Is(err, ref.ErrTampered) {
		t.Errorf("tampered: %v", err)
	}
	other := &Client{Keys: keys(t, "other-ns")}
	if _, _, err := other.Pull(ctx, refs["o"]); !errors.Is(err, ref.ErrForeign) {
		t.Errorf("foreign: %v", err)
	}
	// Expiry is the producer's to judge (a keep-alive may have extended the
	// object past its sealed expiry): TestExtendedObjectOutlivesItsSealedExpiry.
	if _, _, err := c.Pull(ctx, "zt1.garbage"); !errors.Is(err, ref.ErrMalformed) {
		t.Errorf("garbage: %v", err)
	}
	// The object is intact after all that: one good read.
	if got, _, err := c.Pull(ctx, refs["o"]); err != nil || string(got) != "x" {
		t.Errorf("good read after bad ones: %q %v", got, err)
	}
}

// TestPullIntoFileWithoutDoubleMemory pulls 1 GiB straight into a file:
// the consumer never holds the object in memory.
func TestPullIntoFileWithoutDoubleMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 1 GiB")
	}
	const size = 1 << 30
	data := make([]byte, size)
	for i := 0; i < size; i += 4096 {
		data[i] = byte(i >> 12)
	}
	_, refs := startProducer(t, map[string][]byte{"big": data}, 1)
	f, err := os.CreateTemp(t.TempDir(), "obj")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := &Client{Keys: keys(t, "ns")}
	defer c.Close()
	var maxChunk atomic.Int64
	info, err := c.PullTo(context.Background(), refs["big"], func(size int64) (io.WriterAt, error) {
		if err := f.Truncate(size); err != nil {
			return nil, err
		}
		return writerFunc(func(p []byte, off int64) (int, error) {
			if int64(len(p)) > maxChunk.Load() {
				maxChunk.Store(int64(len(p)))
			}
			return f.WriteAt(p, off)
		}), nil
	})
	if err != nil || info.Size != size {
		t.Fatalf("%+v %v", info, err)
	}
	st, _ := f.Stat()
	if st.Size() != size {
		t.Fatalf("file is %d bytes", st.Size())
	}
	// Spot-check content.
	buf := make([]byte, 1)
	for _, off := range []int64{0, 4096, size - 4096} {
		if _, err := f.ReadAt(buf, off); err != nil || buf[0] != byte(off>>12) {
			t.Errorf("byte at %d = %d", off, buf[0])
		}
	}
	if maxChunk.Load() > 256<<10 {
		t.Errorf("largest write %d: chunks must stay small", maxChunk.Load())
	}
}

type writerFunc func(p []byte, off int64) (int, error)

func (w writerFunc) WriteAt(p []byte, off int64) (int, error) { return w(p, off) }

// TestProducerKilledMidTransfer runs the producer as a separate process and
// SIGKILLs it after the first chunk arrived.
func TestProducerKilledMidTransfer(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=TestHelperProducer")
	cmd.Env = append(os.Environ(), "ZT_HELPER_PRODUCER=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("producer did not start: %v", err)
	}
	r := strings.TrimSpace(line)
	c := &Client{Keys: keys(t, "ns")}
	defer c.Close()
	var killed atomic.Bool
	_, err = c.PullTo(context.Background(), r, func(size int64) (io.WriterAt, error) {
		return writerFunc(func(p []byte, off int64) (int, error) {
			if !killed.Swap(true) {
				_ = cmd.Process.Signal(syscall.SIGKILL)
			}
			return len(p), nil
		}), nil
	})
	if !errors.Is(err, ErrProducerGone) {
		t.Fatalf("pull from a killed producer: %v, want ErrProducerGone", err)
	}
	t.Logf("consumer saw: %v", err)
}

// TestHelperProducer is the producer process of the kill test.
func TestHelperProducer(t *testing.T) {
	if os.Getenv("ZT_HELPER_PRODUCER") != "1" {
		t.Skip("helper process for TestProducerKilledMidTransfer")
	}
	_, refs := startProducer(t, map[string][]byte{"big": random(256 << 20)}, 1)
	fmt.Println(refs["big"])
	select {} // until killed
}
