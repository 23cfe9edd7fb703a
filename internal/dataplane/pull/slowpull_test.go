package pull

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// relay is a TCP link between consumers and a real producer: it passes
// the producer's bytes back at most chunk at a time with a pause after
// each (a slow link), and freeze makes it drop everything both ways while
// keeping the connections open (a lost node: no reset, no answer).
type relay struct {
	ln     net.Listener
	target string
	chunk  int
	pause  time.Duration
	chunks atomic.Int64 // chunks passed back

	frozen chan struct{}
	once   sync.Once
	done   chan struct{}
	mu     sync.Mutex
	conns  []net.Conn
}

func startRelay(t *testing.T, target string, chunk int, pause time.Duration) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if chunk <= 0 {
		chunk = 64 << 10
	}
	r := &relay{ln: ln, target: target, chunk: chunk, pause: pause, frozen: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() {
		close(r.done)
		ln.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range r.conns {
			c.Close()
		}
	})
	go r.serve()
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

// freeze drops every byte from now on, both ways.
func (r *relay) freeze() { r.once.Do(func() { close(r.frozen) }) }

func (r *relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		p, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, p)
		r.mu.Unlock()
		go r.pass(p, c, 64<<10, 0, nil)
		go r.pass(c, p, r.chunk, r.pause, &r.chunks)
	}
}

// pass copies from src to dst, n bytes at a time, pausing after each;
// once frozen, what it reads is dropped.
func (r *relay) pass(dst, src net.Conn, n int, pause time.Duration, count *atomic.Int64) {
	buf := make([]byte, n)
	for {
		k, err := src.Read(buf)
		if err != nil {
			return
		}
		select {
		case <-r.frozen:
			continue
		default:
		}
		if _, err := dst.Write(buf[:k]); err != nil {
			return
		}
		if count != nil {
			count.Add(1)
		}
		if pause > 0 {
			select {
			case <-time.After(pause):
			case <-r.done:
				return
			}
		}
	}
}

// TestSlowLiveTransferIsNotCut: a 32 MiB object over a slow link, 64 KiB
// then a 20 ms pause (at least 10 s in all, five times the timeouts):
// each read brings bytes, so neither the answer's timeout nor the body's
// stall timeout cuts it, and the bytes are the producer's (no fallback
// configured: a cut would fail the pull).
func TestSlowLiveTransferIsNotCut(t *testing.T) {
	want := random(32 << 20)
	s, _ := startProducer(t, map[string][]byte{"big": want}, 1)
	rl := startRelay(t, serverAddr(s), 64<<10, 20*time.Millisecond)
	c := &Client{Keys: keys(t, "ns"), Timeouts: Timeouts{Dial: 2 * time.Second, Response: 2 * time.Second, Stall: 2 * time.Second}}
	defer c.Close()
	start := time.Now()
	got, info, err := c.Pull(context.Background(), sealAt(t, rl.addr(), "big"))
	if err != nil {
		t.Fatalf("slow pull: %v", err)
	}
	if !bytes.Equal(got, want) || info.Size != int64(len(want)) {
		t.Fatalf("got %d bytes, want the producer's %d", len(got), len(want))
	}
	if n := rl.chunks.Load(); n < int64(len(want)/(64<<10)) {
		t.Fatalf("the link passed %d chunks: it was not throttled", n)
	}
	t.Logf("%d MiB in %d chunks over %v with 2 s timeouts", len(want)>>20, rl.chunks.Load(), time.Since(start).Round(time.Millisecond))
}

// TestSlowDestinationIsNotCut: a consumer that writes the body slowly
// (100 ms per 256 KiB piece, 3 s in all, three times the stall timeout)
// reads on as long as it likes: the stall timeout counts the producer's
// pauses, not the consumer's. Into a file too (mapped, one read).
func TestSlowDestinationIsNotCut(t *testing.T) {
	want := random(8 << 20)
	_, refs := startProducer(t, map[string][]byte{"a": want, "b": want}, 1)
	c := &Client{Keys: keys(t, "ns"), Timeouts: Timeouts{Stall: time.Second, Response: time.Second}}
	defer c.Close()
	var pieces atomic.Int64
	got := make([]byte, len(want))
	_, err := c.PullTo(context.Background(), refs["a"], func(size int64) (io.WriterAt, error) {
		return writerFunc(func(p []byte, off int64) (int, error) {
			time.Sleep(100 * time.Millisecond)
			pieces.Add(1)
			return copy(got[off:], p), nil
		}), nil
	})
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("slow destination: %v", err)
	}
	if pieces.Load() < 32 {
		t.Fatalf("%d pieces", pieces.Load())
	}
	f, err := os.CreateTemp(t.TempDir(), "obj")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := c.PullTo(context.Background(), refs["b"], func(size int64) (io.WriterAt, error) {
		time.Sleep(2 * time.Second) // the destination is slow to prepare: the header's deadline has passed by now
		return f, f.Truncate(size)
	}); err != nil {
		t.Fatalf("into a file: %v", err)
	}
	if b, _ := os.ReadFile(f.Name()); !bytes.Equal(b, want) {
		t.Fatalf("file holds %d bytes, not the object", len(b))
	}
}
