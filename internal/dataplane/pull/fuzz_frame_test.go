package pull

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"testing"
	"time"
)

// FuzzRequestFrame: the producer's parser of a request never panics or
// allocates past its bounds; what it accepts encodes back to the bytes it
// consumed.
func FuzzRequestFrame(f *testing.F) {
	f.Add((&request{op: opPull, ref: "zt1.abc"}).encode())
	f.Add((&request{op: opExtend, until: math.MaxInt64, ref: ""}).encode())
	f.Add(binary.LittleEndian.AppendUint32(nil, math.MaxUint32))
	f.Add([]byte{12, 0, 0, 0, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		q, err := readRequest(r)
		if err != nil {
			return
		}
		used := len(b) - r.Len()
		if len(q.ref) > maxRef || !bytes.Equal(q.encode(), b[:used]) {
			t.Fatalf("accepted %+v from %x, which encodes differently", q, b[:used])
		}
	})
}

// FuzzResponseFrame: the consumer's parser of a producer's answer never
// panics, accepts error codes only without a body (one it does not know
// reads as ErrRefused: a newer producer's class), and bounds the body it
// announces.
func FuzzResponseFrame(f *testing.F) {
	f.Add((&response{bucket: "b", key: "k", size: 10}).header())
	e := errResponse(ErrExtendTooFar)
	f.Add(e.header())
	f.Add((&response{code: 200}).header())
	f.Add(binary.LittleEndian.AppendUint32(nil, 1<<30))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := readResponse(bufio.NewReader(bytes.NewReader(b)))
		if err != nil {
			return
		}
		if (p.code != codeOK && p.size != 0) || p.size > MaxObject || (int(p.code) >= len(codeErrors) && codeError(p.code) != ErrRefused) {
			t.Fatalf("accepted %+v", p)
		}
		if !bytes.HasPrefix(b, p.header()) {
			t.Fatalf("accepted %+v from %x, which encodes differently", p, b)
		}
	})
}

// FuzzProducerStream sends arbitrary bytes after the magic to a live
// producer: it answers or hangs up, never crashes, and still serves a
// genuine pull afterwards.
func FuzzProducerStream(f *testing.F) {
	obj := random(100 << 10)
	s, refs := startProducer(f, map[string][]byte{"o": obj}, math.MaxUint32, func(s *Server) { s.HeaderTimeout = 100 * time.Millisecond })
	genuine := (&request{op: opPull, ref: refs["o"]}).encode()
	f.Add(genuine)
	f.Add(append(genuine, genuine...))
	f.Add((&request{op: opExtend, until: time.Now().Add(time.Hour).UnixMilli(), ref: refs["o"]}).encode())
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f})
	f.Add(genuine[:len(genuine)/2])
	c := &Client{Keys: s.Keys}
	f.Cleanup(c.Close)
	f.Fuzz(func(t *testing.T, b []byte) {
		nc, err := net.Dial("tcp", serverAddr(s))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_, _ = nc.Write(append(StreamMagic[:], b...))
		_ = nc.(*net.TCPConn).CloseWrite()
		_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, nc); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the producer neither answered nor hung up")
			}
		}
		got, _, err := c.Pull(context.Background(), refs["o"])
		if err != nil || !bytes.Equal(got, obj) {
			t.Fatalf("genuine pull after the fuzz input: %d bytes, %v", len(got), err)
		}
	})
}

// TestANewerProducersErrorCodeIsRefused: the code table is append only, so
// a producer built later may answer a code this consumer does not know
// (during a rolling upgrade): it reads as ErrRefused with the producer's
// message, not as a malformed frame that would end the connection.
func TestANewerProducersErrorCodeIsRefused(t *testing.T) {
	b := (&response{code: uint8(len(codeErrors)), msg: "a class added later"}).header()
	p, err := readResponse(bufio.NewReader(bytes.NewReader(b)))
	if err != nil {
		t.Fatalf("a newer producer's error code: %v", err)
	}
	if codeError(p.code) != ErrRefused || p.msg != "a class added later" {
		t.Fatalf("read %+v as %v, want ErrRefused with the message", p, codeError(p.code))
	}
}
