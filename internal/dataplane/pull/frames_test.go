package pull

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

// frame is a Cap'n Proto stream frame header: segment count - 1, then each
// segment's size in words (padded to 8 bytes), then the given body.
func frame(segWords []uint32, body []byte) []byte {
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, uint32(len(segWords)-1))
	for _, w := range segWords {
		b = binary.LittleEndian.AppendUint32(b, w)
	}
	if len(b)%8 != 0 {
		b = append(b, 0, 0, 0, 0)
	}
	return append(b, body...)
}

// badFrames are the byte streams a broken or hostile peer may send.
var badFrames = map[string][]byte{
	"random bytes":        random(4096),
	"truncated frame":     frame([]uint32{100}, bytes.Repeat([]byte{1}, 64)),
	"huge segment":        frame([]uint32{1 << 30}, bytes.Repeat([]byte{0}, 64)),
	"many segments":       frame(make([]uint32, 1000), nil),
	"zero-length message": frame([]uint32{0}, nil),
	"pointer garbage":     frame([]uint32{4}, bytes.Repeat([]byte{0xff}, 32)),
}

// TestGarbageFramesToTheProducer: malformed frames close that connection
// only; the producer keeps serving everybody else.
func TestGarbageFramesToTheProducer(t *testing.T) {
	_, refs := startProducer(t, map[string][]byte{"o": random(1 << 20)}, 1)
	rec, err := keys(t, "ns").Open(refs["o"], time.Now())
	if err != nil {
		t.Fatal(err)
	}
	addr := rec.Addr
	for name, data := range badFrames {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = nc.Write(data)
		_ = nc.(*net.TCPConn).CloseWrite() // a truncated frame ends in EOF
		_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err = io.Copy(io.Discard, nc) // until the producer hangs up
		nc.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s: the producer kept the connection open", name)
		}
	}
	c := &Client{Keys: keys(t, "ns")}
	defer c.Close()
	if _, _, err := c.Pull(context.Background(), refs["o"]); err != nil {
		t.Fatalf("pull after the garbage: %v", err)
	}
}

// TestGarbageFramesFromTheProducer: a consumer whose "producer" answers
// with garbage gets ErrProducerGone, not a hang or a crash.
func TestGarbageFramesFromTheProducer(t *testing.T) {
	k := keys(t, "ns")
	for name, data := range badFrames {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			defer nc.Close()
			_, _ = nc.Write(data)
			// Half-close: the consumer sees EOF after the bad bytes.
			_ = nc.(*net.TCPConn).CloseWrite()
			_, _ = io.Copy(io.Discard, nc)
		}()
		r, err := k.Seal(ref.Record{Addr: ln.Addr().String(), Key: "o", Expires: time.Now().Add(time.Hour), Reads: 1})
		if err != nil {
			t.Fatal(err)
		}
		c := &Client{Keys: k}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, _, err = c.Pull(ctx, r)
		cancel()
		c.Close()
		ln.Close()
		if !errors.Is(err, ErrProducerGone) {
			t.Errorf("%s: %v, want ErrProducerGone", name, err)
		}
		t.Logf("%s: consumer saw: %v", name, err)
	}
}
