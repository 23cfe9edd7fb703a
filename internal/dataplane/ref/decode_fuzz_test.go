package ref

import (
	"errors"
	"testing"
	"time"
)

// FuzzDecode feeds arbitrary plaintexts to the record decoder, which
// FuzzOpen cannot reach (random input fails authentication first) but a
// holder of a leaked key could. It must never panic, must refuse with
// ErrMalformed, and what it accepts must survive an encode/decode round trip.
func FuzzDecode(f *testing.F) {
	f.Add(encode(Record{Addr: "10.0.0.1:9192", Key: "s1/b/k/1", Namespace: "ns", Expires: time.Unix(1700000000, 5), Reads: 3}))
	f.Add(encode(Record{}))
	f.Add(encode(Record{Addr: "10.0.0.1:9192", Key: "k", Namespace: "ns", Node: "node-a", Pod: "0b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e11"}))
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}) // varint overflow
	f.Add([]byte{0x80, 0x00, 0x00, 0x00})                                     // overlong length
	f.Add([]byte{0x05, 'a', 'b'})                                             // length beyond the data
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("decode(%x): error %v is not ErrMalformed", b, err)
			}
			return
		}
		again, err := decode(encode(r))
		if err != nil || again.Addr != r.Addr || again.Key != r.Key || again.Namespace != r.Namespace ||
			!again.Expires.Equal(r.Expires) || again.Reads != r.Reads ||
			again.Node != r.Node || again.Pod != r.Pod {
			t.Fatalf("decode(%x) = %+v, but its re-encoding decodes to %+v (%v)", b, r, again, err)
		}
	})
}
