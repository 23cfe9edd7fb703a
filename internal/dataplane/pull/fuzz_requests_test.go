package pull

import (
	"bytes"
	"context"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3/rpc"

	dp "github.com/ziptrail/ziptrail/internal/dataplane/capnp"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

// refErrors are the texts a producer's refusal of a bad reference carries.
var refErrors = []error{ref.ErrMalformed, ref.ErrUnknownKey, ref.ErrTampered, ref.ErrExpired, ref.ErrForeign}

// FuzzProducerRequests sends well-formed calls with arbitrary arguments —
// open (reference, prefetch), read (offset, length) on the reader it got,
// extend (reference, expiry) — which random frames (FuzzProducerFrames)
// seldom reach. The producer must answer each: a genuine reference opens
// and reads exactly the object's bytes, a mangled one is refused with a
// reference error, a read outside the object or over MaxChunk is refused,
// and no extend keeps the object beyond MaxExtend from now.
func FuzzProducerRequests(f *testing.F) {
	obj := random(3*4096 + 17)
	s, refs := startProducer(f, map[string][]byte{"o": obj}, math.MaxUint32)
	s.MaxExtend = 2 * time.Hour // beyond the object's 1 h, so extends do move it
	genuine := refs["o"]

	f.Add([]byte(nil), uint16(0), uint32(4096), uint64(4096), uint32(4096), int64(time.Minute/time.Millisecond))
	f.Add([]byte(nil), uint16(0), uint32(0), uint64(len(obj)), uint32(1), int64(3*time.Hour/time.Millisecond))
	f.Add([]byte(nil), uint16(0), uint32(math.MaxUint32), uint64(math.MaxUint64), uint32(math.MaxUint32), int64(math.MaxInt64))
	f.Add([]byte("A"), uint16(len(genuine)-5), uint32(1), uint64(0), uint32(MaxChunk+1), int64(math.MinInt64))
	f.Add([]byte("zt1.garbage"), uint16(0), uint32(0), uint64(0), uint32(0), int64(0))
	f.Add([]byte{0xff, 0x00}, uint16(4), uint32(16), uint64(1), uint32(16), int64(-1))
	f.Fuzz(func(t *testing.T, edit []byte, at uint16, prefetch uint32, off uint64, length uint32, untilDelta int64) {
		r := genuine
		if len(edit) > 0 {
			i := int(at) % (len(genuine) + 1)
			r = genuine[:i] + string(edit)
		}
		// A mangled reference may still open (base64's unused trailing
		// bits); FuzzOpen checks the keyring, this the producer.
		_, oerr := s.Keys.Open(r, time.Now())
		valid := oerr == nil
		if r == genuine && !valid {
			t.Fatalf("the genuine reference does not open: %v", oerr)
		}

		mine, peer := net.Pipe()
		srv := s.newConn(mine)
		defer func() { _ = srv.Close() }()
		conn := rpc.NewConn(rpc.NewStreamTransport(peer), nil)
		defer func() { _ = conn.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a hang fails the run
		defer cancel()
		prod := dp.Producer(conn.Bootstrap(ctx))
		defer prod.Release()

		openRequest(t, ctx, prod, r, valid, obj, prefetch, off, length)
		extendRequest(t, ctx, s, prod, r, valid, untilDelta)
	})
}

func openRequest(t *testing.T, ctx context.Context, prod dp.Producer, r string, valid bool, obj []byte, prefetch uint32, off uint64, length uint32) {
	fut, release := prod.Open(ctx, func(p dp.Producer_open_Params) error {
		p.SetPrefetch(prefetch)
		return p.SetRef(r)
	})
	defer release()
	res, err := fut.Struct()
	if !valid {
		if err == nil || !namesOne(err, refErrors) {
			t.Fatalf("open of mangled reference %q: %v, want a reference error", r, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("open of the genuine reference (prefetch %d): %v", prefetch, err)
	}
	head, _ := res.Head()
	if res.Size() != uint64(len(obj)) || !bytes.Equal(head, obj[:min(int(prefetch), len(obj), MaxChunk)]) {
		t.Fatalf("open (prefetch %d): size %d, %d head bytes", prefetch, res.Size(), len(head))
	}
	if len(head) == len(obj) {
		return // no reader
	}
	rd := res.Reader()
	rf, rrelease := rd.Read(ctx, func(p dp.Reader_read_Params) error {
		p.SetOffset(off)
		p.SetLength(length)
		return nil
	})
	defer rrelease()
	out, err := rf.Struct()
	switch {
	case length > MaxChunk || off > uint64(len(obj)):
		if err == nil {
			t.Fatalf("read %d bytes at %d of a %d-byte object was served", length, off, len(obj))
		}
	case err != nil:
		t.Fatalf("read %d bytes at %d: %v", length, off, err)
	default:
		data, _ := out.Data()
		if want := obj[off:min(off+uint64(length), uint64(len(obj)))]; !bytes.Equal(data, want) {
			t.Fatalf("read %d bytes at %d: got %d bytes, not the object's", length, off, len(data))
		}
	}
}

func extendRequest(t *testing.T, ctx context.Context, s *Server, prod dp.Producer, r string, valid bool, untilDelta int64) {
	before := time.Now()
	until := before.UnixMilli() + untilDelta // wraps like any int64 a peer may send
	fut, release := prod.Extend(ctx, func(p dp.Producer_extend_Params) error {
		p.SetUntilUnixMs(until)
		return p.SetRef(r)
	})
	defer release()
	res, err := fut.Struct()
	after := time.Now()
	limit := s.maxExtend()
	switch {
	case !valid:
		if err == nil || !namesOne(err, refErrors) {
			t.Fatalf("extend with mangled reference %q: %v, want a reference error", r, err)
		}
	case until > after.Add(limit).UnixMilli():
		if err == nil || !strings.Contains(err.Error(), ErrExtendTooFar.Error()) {
			t.Fatalf("extend to %d ms (limit %v): %v, want ErrExtendTooFar", until, limit, err)
		}
	case until <= before.Add(limit).UnixMilli():
		if err != nil || !res.Ok() {
			t.Fatalf("extend to %d ms (within %v): %v", until, limit, err)
		}
	}
	if _, m, ok := s.Store.Peek("o"); !ok || m.Expires.After(time.Now().Add(limit)) {
		t.Fatalf("the object expires at %v (held %v), beyond the %v limit", m.Expires, ok, limit)
	}
}

func namesOne(err error, errs []error) bool {
	for _, e := range errs {
		if strings.Contains(err.Error(), e.Error()) {
			return true
		}
	}
	return false
}
