package messaging

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// The message stream's framings are read from any pod's connection to the
// data-plane port: the receiver's headers and bodies (ServeStream), the
// sender's answers (answers). The fuzz targets feed them arbitrary bytes:
// nothing may panic (a recovered panic counts as a failure here), and
// what is read must be what was written.

func wireSeeds() [][]byte {
	var out [][]byte
	for _, w := range []wire{
		{auth: "zt1.token", session: "s1", group: "g", from: 0, to: 1, tag: 7, seq: 1, id: 1, size: 5},
		{session: "s", group: "g", to: 1, tag: -3, seq: 2, id: 2},
		{auth: string(make([]byte, maxStrings)), size: maxBody},
	} {
		b := w.header()
		if w.size <= 5 {
			b = append(b, "hello"[:w.size]...)
		}
		out = append(out, b)
	}
	return out
}

// FuzzStreamHeader: a stream's headers, one after another, parse or fail
// with errFrame (or the stream's end); one that parses encodes back to
// the same bytes.
func FuzzStreamHeader(f *testing.F) {
	for _, s := range wireSeeds() {
		f.Add(s)
		f.Add(append(append([]byte{}, s...), s...))
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReader(bytes.NewReader(b))
		var hr headerReader
		for range 64 {
			w, err := hr.read(br)
			if err != nil {
				if !errors.Is(err, errFrame) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("error %v", err)
				}
				return
			}
			if w.size > maxBody || len(w.auth)+len(w.session)+len(w.group) > maxStrings {
				t.Fatalf("accepted %+v", w)
			}
			again, err := (&headerReader{}).read(bufio.NewReader(bytes.NewReader(w.header())))
			if err != nil || again != w {
				t.Fatalf("%+v encodes to a header that reads as %+v, %v", w, again, err)
			}
		}
	})
}

// fuzzFile is a Config.NewFile in memory, refusing what a small object
// directory would.
type fuzzFile struct{ mem []byte }

func (f *fuzzFile) Path() string        { return "fuzz" }
func (f *fuzzFile) Mem() []byte         { return f.mem }
func (f *fuzzFile) HandOut(bool) string { return "" }
func (f *fuzzFile) Discard()            {}
func newFuzzFile(size int64) (File, error) {
	if size > 1<<20 {
		return nil, errors.New("no room")
	}
	return &fuzzFile{mem: make([]byte, size)}, nil
}

// fuzzRouter is a router whose rank 1 of group g of session s1 runs here,
// with the keyring kr.
func fuzzRouter(kr *ref.Keyring) *Router {
	r := New(Config{Self: "127.0.0.1:1", Keys: func() *ref.Keyring { return kr }, NewFile: newFuzzFile, InlineMax: 1 << 10,
		QueueBytes: 1 << 40, HandshakeTimeout: time.Minute}) // never full: nobody receives here
	g := &group{changed: make(chan struct{}), local: map[uint32]*member{}, seq: map[[2]uint32]uint64{}, size: 2,
		view: &controlv1.GroupView{Session: "s1", Group: "g", Size: 2, Epoch: 1}}
	g.local[1] = &member{rank: 1, wake: make(chan struct{}), seen: map[[2]uint64]struct{}{}}
	r.groups[gkey{"s1", "g"}] = g
	return r
}

// FuzzServeStream: a stream's bytes (after its magic) from a peer: the
// receiver reads them until they end or break the format, answers with
// the statuses there are, queues only what a valid authenticator
// carried, and keeps no room for messages it did not queue.
func FuzzServeStream(f *testing.F) {
	kr, err := ref.NewKeyring("team-a", map[string][]byte{"k1": make([]byte, 32)}, "k1")
	if err != nil {
		f.Fatal(err)
	}
	auth, err := kr.Seal(ref.Record{Addr: "127.0.0.1:2", Key: authKey("s1", "g"), Expires: time.Now().Add(24 * time.Hour), Reads: 1})
	if err != nil {
		f.Fatal(err)
	}
	msg := func(to uint32, seq uint64, body []byte) []byte {
		w := wire{auth: auth, session: "s1", group: "g", from: 0, to: to, tag: 1, seq: seq, id: seq, size: uint64(len(body))}
		return append(w.header(), body...)
	}
	f.Add(msg(1, 1, []byte("hello")))
	f.Add(append(msg(1, 1, []byte("a")), msg(1, 2, bytes.Repeat([]byte{9}, 2<<10))...))
	f.Add(append(msg(0, 1, []byte("not here")), msg(1, 1, nil)...))
	f.Add(append(msg(1, 1, nil), msg(1, 1, nil)...)) // a duplicate
	for _, s := range wireSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := fuzzRouter(kr)
		panicsBefore := testutil.ToFloat64(panics.WithLabelValues("stream"))
		c := &bytesConn{r: bytes.NewReader(b)}
		r.ServeStream(c)
		answers := c.w.Bytes()
		if got := testutil.ToFloat64(panics.WithLabelValues("stream")); got != panicsBefore {
			t.Fatal("the stream's reader panicked")
		}
		if len(answers)%answerLen != 0 {
			t.Fatalf("%d bytes of answers", len(answers))
		}
		for a := answers; len(a) > 0; a = a[answerLen:] {
			if st := Status(a[8]); st > Refused {
				t.Fatalf("answer %d", st)
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		mb := r.groups[gkey{"s1", "g"}].local[1]
		if mb.reserved != 0 || mb.parked != 0 {
			t.Fatalf("room kept for %d bytes, %d readers waiting, after the stream ended", mb.reserved, mb.parked)
		}
		var sum int64
		for _, m := range mb.inbox {
			sum += int64(m.Size)
			if m.Session != "s1" || m.Group != "g" || m.To != 1 || (m.File == nil && uint64(len(m.Data)) != m.Size) {
				t.Fatalf("queued %+v", m)
			}
		}
		if sum != mb.bytes {
			t.Fatalf("inbox of %d bytes counts %d", sum, mb.bytes)
		}
	})
}

// bytesConn is a connection whose peer sent r's bytes and then ended.
type bytesConn struct {
	r *bytes.Reader
	w bytes.Buffer
}

func (c *bytesConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error)      { return c.w.Write(p) }
func (c *bytesConn) Close() error                     { return nil }
func (c *bytesConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *bytesConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *bytesConn) SetDeadline(time.Time) error      { return nil }
func (c *bytesConn) SetReadDeadline(time.Time) error  { return nil }
func (c *bytesConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzStreamAnswers: a peer's answers to this sidecar's deliveries: each
// delivery gets exactly one outcome, its answer or ErrUnreachable when
// the stream ends first.
func FuzzStreamAnswers(f *testing.F) {
	ans := func(id uint64, st byte) []byte { return append(binary.LittleEndian.AppendUint64(nil, id), st) }
	f.Add(ans(1, 0))
	f.Add(append(ans(2, 1), ans(1, 3)...))
	f.Add(append(ans(1, 0), ans(1, 0)[:5]...))
	f.Add(append(ans(99, 200), ans(3, 2)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		here, peer := net.Pipe()
		p := &peerStream{conn: here, raw: here, wslot: make(chan struct{}, 1), waiting: map[uint64]answerFunc{}, dead: make(chan struct{})}
		const n = 4
		var mu sync.Mutex
		outcomes := make([]int, n+1)
		for id := uint64(1); id <= n; id++ {
			p.waiting[id] = func(Status, error) {
				mu.Lock()
				outcomes[id]++
				mu.Unlock()
			}
		}
		before := testutil.ToFloat64(panics.WithLabelValues("answers"))
		go func() {
			_, _ = peer.Write(b)
			peer.Close()
		}()
		p.answers("fuzz")
		if got := testutil.ToFloat64(panics.WithLabelValues("answers")); got != before {
			t.Fatal("the answers' reader panicked")
		}
		for id := 1; id <= n; id++ {
			if outcomes[id] != 1 {
				t.Fatalf("delivery %d got %d outcomes", id, outcomes[id])
			}
		}
	})
}
