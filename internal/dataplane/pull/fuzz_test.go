package pull

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

// recordingConn keeps every byte read from the peer.
type recordingConn struct {
	net.Conn
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.buf.Write(p[:n])
	c.mu.Unlock()
	return n, err
}

// recordedSession returns the bytes a real consumer sends for one pull
// (bootstrap, open with a valid reference, chunk reads, releases): the seed
// that lets the fuzzer start from well-formed requests.
func recordedSession(f *testing.F, s *Server, key string) []byte {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()
	rec := make(chan *recordingConn, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			close(rec)
			return
		}
		rc := &recordingConn{Conn: nc}
		conn := s.newConn(rc)
		<-conn.Done()
		rec <- rc
	}()
	// The producer does not check the address in a reference, so the
	// recorded requests replay against s on any connection.
	r, err := s.Keys.Seal(ref.Record{Addr: ln.Addr().String(), Key: key, Expires: time.Now().Add(time.Hour), Reads: 1})
	if err != nil {
		f.Fatal(err)
	}
	c := &Client{Keys: s.Keys, ChunkSize: 4096, Window: 2}
	if _, _, err := c.Pull(context.Background(), r); err != nil {
		f.Fatal(err)
	}
	c.Close()
	rc, ok := <-rec
	if !ok {
		f.Fatal("no consumer connection recorded")
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return bytes.Clone(rc.buf.Bytes())
}

// FuzzProducerFrames feeds arbitrary bytes to a producer connection as a
// consumer would send them. The producer must neither panic nor hang: once
// the peer hangs up, the connection ends.
func FuzzProducerFrames(f *testing.F) {
	s, _ := startProducer(f, map[string][]byte{"o": random(20000)}, 1<<30)
	seed := recordedSession(f, s, "o")
	if len(seed) < 64 {
		f.Fatalf("recorded only %d bytes of a pull", len(seed))
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	for _, b := range badFrames {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		mine, peer := net.Pipe()
		conn := s.newConn(mine)
		go func() { _, _ = io.Copy(io.Discard, peer) }() // answers, if any
		// The producer may stop reading a connection it gave up on; a peer
		// that cannot write just hangs up.
		_ = peer.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = peer.Write(data)
		_ = peer.Close()
		select {
		case <-conn.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("producer connection still open 10 s after the peer hung up (input %x)", data)
		}
	})
}
