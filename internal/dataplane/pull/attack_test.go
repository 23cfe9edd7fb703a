package pull

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// Attacks straight to the producer's data-plane port, no Client in
// between: each gets a clear answer or loses its connection, and none
// leaves a goroutine, a file descriptor or a lease behind.

// eventually polls cond for up to 20 s (a bound for a hung test, not a
// timing assertion).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("count open descriptors: %v", err)
	}
	return len(ents)
}

// noLeaks checks, once the test's connections are gone, that the
// goroutines and file descriptors came back to where they were.
func noLeaks(t *testing.T) {
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	t.Cleanup(func() {
		eventually(t, "goroutines back to the start", func() bool { return runtime.NumGoroutine() <= g0 })
		eventually(t, "file descriptors back to the start", func() bool { return openFDs(t) <= fd0 })
	})
}

// serverAddr is the producer's listening address (read under its lock:
// Serve sets the listener in its own goroutine).
func serverAddr(s *Server) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ln.Addr().String()
}

func dialRaw(t *testing.T, s *Server, prefix []byte) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", serverAddr(s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if len(prefix) > 0 {
		if _, err := nc.Write(prefix); err != nil {
			t.Fatal(err)
		}
	}
	return nc
}

// closedByServer reads until the server hangs up (EOF or reset), never
// waiting on a deadline of its own shorter than 20 s.
func closedByServer(t *testing.T, nc net.Conn) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.Copy(io.Discard, nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the producer kept the connection open")
	}
}

func rawPull(t *testing.T, nc net.Conn, br *bufio.Reader, r string) (response, []byte) {
	t.Helper()
	q := request{op: opPull, ref: r}
	if _, err := nc.Write(q.encode()); err != nil {
		t.Fatal(err)
	}
	p, err := readResponse(br)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, p.size)
	if _, err := io.ReadFull(br, body); err != nil {
		t.Fatal(err)
	}
	return p, body
}

func TestRawBadReferencesAnsweredOnOneConnection(t *testing.T) {
	noLeaks(t)
	s, refs := startProducer(t, map[string][]byte{"o": []byte("secret bytes")}, 1)
	addr := serverAddr(s)
	tampered := []byte(refs["o"])
	if tampered[len(tampered)-5] == 'A' { // another valid base64url character
		tampered[len(tampered)-5] = 'B'
	} else {
		tampered[len(tampered)-5] = 'A'
	}
	foreign, err := keys(t, "other-ns").Seal(ref.Record{Addr: addr, Key: "o", Expires: time.Now().Add(time.Hour), Reads: 1})
	if err != nil {
		t.Fatal(err)
	}
	// An object whose reference and store expiry both passed (one a
	// keep-alive extended is still served: extend_test.go).
	past := time.Now().Add(-time.Minute)
	if err := s.Store.Put(context.Background(), store.Meta{ID: "old", Key: "old", Reads: 1, Expires: past}, []byte("old")); err != nil {
		t.Fatal(err)
	}
	expired, err := s.Keys.Seal(ref.Record{Addr: addr, Key: "old", Expires: past, Reads: 1})
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := ref.NewKeyring("ns", map[string][]byte{"k9": bytes.Repeat([]byte{1}, 32)}, "k9")
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := otherKey.Seal(ref.Record{Addr: addr, Key: "o", Expires: time.Now().Add(time.Hour), Reads: 1})
	if err != nil {
		t.Fatal(err)
	}
	nc := dialRaw(t, s, StreamMagic[:])
	br := bufio.NewReader(nc)
	for _, c := range []struct {
		name, ref string
		want      error
	}{
		{"forged", string(tampered), ref.ErrTampered},
		{"foreign namespace", foreign, ref.ErrForeign},
		{"expired", expired, ref.ErrExpired},
		{"unknown key", unknown, ref.ErrUnknownKey},
		{"garbage", "zt1.garbage", ref.ErrMalformed},
		{"empty", "", ref.ErrMalformed},
		{"not a reference", string(bytes.Repeat([]byte{0xff}, maxRef)), ref.ErrMalformed},
	} {
		p, body := rawPull(t, nc, br, c.ref)
		if p.code == codeOK || codeErrors[p.code] != c.want || len(body) != 0 {
			t.Errorf("%s: code %d (%v) %q, %d body bytes; want %v", c.name, p.code, codeErrors[min(int(p.code), len(codeErrors)-1)], p.msg, len(body), c.want)
		}
	}
	// The connection is still in step, and the object intact.
	if p, body := rawPull(t, nc, br, refs["o"]); p.code != codeOK || string(body) != "secret bytes" {
		t.Fatalf("good pull after bad ones: code %d %q", p.code, body)
	}
	if p, _ := rawPull(t, nc, br, refs["o"]); codeErrors[p.code] != store.ErrExhausted {
		t.Fatalf("second read of a one-read object: code %d %q", p.code, p.msg)
	}
}

func TestRawMalformedFrames(t *testing.T) {
	noLeaks(t)
	s, refs := startProducer(t, map[string][]byte{"o": []byte("x")}, 1, func(s *Server) { s.HeaderTimeout = 200 * time.Millisecond })
	frame := func(n uint32, rest ...byte) []byte {
		b := binary.LittleEndian.AppendUint32(append([]byte{}, StreamMagic[:]...), n)
		return append(b, rest...)
	}
	good := (&request{op: opPull, ref: refs["o"]}).encode()
	for name, c := range map[string]struct {
		send       []byte
		wantAnswer bool // an errFrame answer before the close
	}{
		"oversized length":    {frame(1 << 31), true},
		"length below header": {frame(3, 1, 0, 0), true},
		"unknown op":          {frame(reqFixed, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), true},
		"flags set":           {frame(reqFixed, 1, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), true},
		"garbage magic":       {[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), false},
		"capnp-like start":    {[]byte{0, 0, 0, 0, 2, 0, 0, 0}, false},
		"truncated frame":     {append(append([]byte{}, StreamMagic[:]...), good[:len(good)-5]...), false},
		"half a length":       {append(append([]byte{}, StreamMagic[:]...), 0x10, 0), false},
		"half a magic":        {[]byte("ZT"), false},
		"magic then nothing":  {StreamMagic[:], false},
	} {
		t.Run(name, func(t *testing.T) {
			nc := dialRaw(t, s, c.send)
			if c.wantAnswer {
				p, err := readResponse(bufio.NewReader(nc))
				if err != nil || codeErrors[p.code] != errFrame {
					t.Fatalf("answer %+v %v, want a malformed-frame error", p, err)
				}
			}
			// Truncated and half-sent frames are slowloris: the producer
			// hangs up once HeaderTimeout passes without the rest (a
			// connection that sent only the magic waits up to the idle
			// timeout, set below).
			if name == "magic then nothing" {
				return
			}
			closedByServer(t, nc)
		})
	}
	// An idle connection is closed after IdleTimeout (a producer of its
	// own: limits are set before a server serves).
	idle, _ := startProducer(t, nil, 1, func(s *Server) { s.IdleTimeout = 200 * time.Millisecond })
	closedByServer(t, dialRaw(t, idle, StreamMagic[:]))
	// Nothing of that reached the object.
	c := &Client{Keys: s.Keys}
	defer c.Close()
	if got, _, err := c.Pull(context.Background(), refs["o"]); err != nil || string(got) != "x" {
		t.Fatalf("pull after the attacks: %q %v", got, err)
	}
}

// TestRawConsumerThatStopsReading: a consumer asks for a large object and
// never reads it. The producer gives up after WriteTimeout and frees the
// lease (the object, read once of once, is gone).
func TestRawConsumerThatStopsReading(t *testing.T) {
	noLeaks(t)
	s, refs := startProducer(t, map[string][]byte{"big": random(64 << 20)}, 1, func(s *Server) { s.WriteTimeout = 200 * time.Millisecond })
	nc := dialRaw(t, s, StreamMagic[:])
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	if _, err := nc.Write((&request{op: opPull, ref: refs["big"]}).encode()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the producer released the object", func() bool { return s.Store.Len() == 0 })
	nc.Close()
}

// TestRawManyConnections: past MaxConns pull connections, more are closed
// at once; the producer serves again once they are gone.
func TestRawManyConnections(t *testing.T) {
	noLeaks(t)
	s, refs := startProducer(t, map[string][]byte{"o": []byte("x")}, 1, func(s *Server) { s.MaxConns = 8 })
	var held []net.Conn
	br := []*bufio.Reader{}
	for range 8 {
		nc := dialRaw(t, s, StreamMagic[:])
		held = append(held, nc)
		br = append(br, bufio.NewReader(nc))
	}
	// Each of the 8 is served (a round trip proves it is registered).
	for i, nc := range held {
		if p, _ := rawPull(t, nc, br[i], "zt1.garbage"); codeErrors[p.code] != ref.ErrMalformed {
			t.Fatalf("conn %d: code %d", i, p.code)
		}
	}
	for range 50 {
		closedByServer(t, dialRaw(t, s, StreamMagic[:]))
	}
	for _, nc := range held {
		nc.Close()
	}
	c := &Client{Keys: s.Keys}
	defer c.Close()
	eventually(t, "a pull succeeds after the flood", func() bool {
		got, _, err := c.Pull(context.Background(), refs["o"])
		if errors.Is(err, ErrProducerGone) {
			return false
		}
		if err != nil || string(got) != "x" {
			t.Fatalf("pull: %q %v", got, err)
		}
		return true
	})
}

// TestClientReusesConnections: pulls from one producer share one
// connection; one the producer closed while idle is replaced.
func TestClientReusesConnections(t *testing.T) {
	s, refs := startProducer(t, map[string][]byte{"a": []byte("a"), "b": []byte("b"), "c": []byte("c")}, 1)
	c := &Client{Keys: s.Keys}
	defer c.Close()
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if got, _, err := c.Pull(ctx, refs[id]); err != nil || string(got) != id {
			t.Fatalf("%s: %q %v", id, got, err)
		}
	}
	s.mu.Lock()
	n := len(s.conns)
	for nc := range s.conns {
		nc.Close() // as the idle timeout would
	}
	s.mu.Unlock()
	if n != 1 {
		t.Errorf("%d connections for two pulls in a row, want 1", n)
	}
	if got, _, err := c.Pull(ctx, refs["c"]); err != nil || string(got) != "c" {
		t.Fatalf("pull over a connection the producer closed: %q %v", got, err)
	}
}

// TestClientReplacesEveryStaleConnection: the pool holds several
// connections to one producer when its idle timeout closes them all
// (pulls that ran side by side left them). The next pull gets its object
// over a new connection. Before, it retried once on the next pooled
// connection, closed too, and reported the producer gone: a live
// producer's object taken for lost (bench/sort: "write: broken pipe ...
// no tier has it either").
func TestClientReplacesEveryStaleConnection(t *testing.T) {
	s, refs := startProducer(t, map[string][]byte{"a": []byte("a")}, 0)
	c := &Client{Keys: s.Keys}
	defer c.Close()
	ctx := context.Background()
	rec, err := s.Keys.Open(refs["a"], time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var pcs []*peerConn
	for range 4 {
		pc, _, err := c.conn(ctx, rec.Addr)
		if err != nil {
			t.Fatal(err)
		}
		pcs = append(pcs, pc)
	}
	for _, pc := range pcs {
		c.put(pc)
	}
	// The producer registers each connection once it accepted it.
	for deadline := time.Now().Add(10 * time.Second); ; {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the producer holds %d connections, want 4", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.mu.Lock()
	for nc := range s.conns {
		nc.Close() // as the idle timeout would
	}
	s.mu.Unlock()
	if got, _, err := c.Pull(ctx, refs["a"]); err != nil || string(got) != "a" {
		t.Fatalf("pull after the producer closed every idle connection: %q %v", got, err)
	}
}

// TestClientDropsOldIdleConnections: connections to producers that went
// away are not kept open forever (a sidecar pulls from pods that come and
// go).
func TestClientDropsOldIdleConnections(t *testing.T) {
	c := &Client{}
	now := time.Now()
	mk := func(addr string, age time.Duration) net.Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		c.idle[addr] = append(c.idle[addr], &peerConn{addr: addr, nc: &deadlineConn{Conn: a}, since: now.Add(-age)})
		return b
	}
	c.idle = map[string][]*peerConn{}
	gone := mk("gone:1", 2*maxIdleAge)
	old := mk("mixed:1", 2*maxIdleAge)
	mk("mixed:1", time.Second)
	c.sweepLocked(now)
	if _, ok := c.idle["gone:1"]; ok || len(c.idle["mixed:1"]) != 1 {
		t.Fatalf("after the sweep: %v", c.idle)
	}
	for _, peer := range []net.Conn{gone, old} {
		if _, err := peer.Read(make([]byte, 1)); err == nil {
			t.Error("an old idle connection is still open")
		}
	}
}
