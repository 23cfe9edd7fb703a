package pull

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// The pull stream (docs/dataplane.md): a consumer's sidecar opens a TCP
// connection to the producer's data-plane port, sends StreamMagic once,
// then any number of requests, one at a time; each is answered on the
// same connection by a header and, for a pull, the object's bytes right
// after it. A small object costs one round trip; a large one streams at
// the wire's speed (written with writev from the store's memory, or the
// shared-memory file it lives in, and read straight into the
// destination). Connections stay open for the next pull.
//
//	request:  u32 n (bytes after it), u8 op (1 pull, 2 extend), u8 flags (0),
//	          u16 0, i64 untilUnixMs (extend), reference (n-12 bytes)
//	response: u32 n (bytes after it), u8 code (0 ok, else the error class),
//	          u8 flags (bit 0: extend ok), u16 bucket, key, message lengths,
//	          u64 size, then bucket, key, message, then size body bytes

// StreamMagic starts a pull stream (Server tells it from a message stream,
// messaging.StreamMagic, by these four bytes).
var StreamMagic = [4]byte{'Z', 'T', 'P', '1'}

const (
	opPull   = 1
	opExtend = 2

	reqFixed  = 12
	maxRef    = 4 << 10 // a sealed reference is ~200 bytes
	respFixed = 16
	maxNames  = 3 * math.MaxUint16
	// MaxObject bounds an object's size on the wire (a header claiming
	// more is refused before anything is allocated).
	MaxObject = 1 << 40
)

// errFrame: a request or response that is not a well-formed frame.
var errFrame = errors.New("malformed pull frame")

type request struct {
	op    uint8
	until int64
	ref   string
}

func (q *request) encode() []byte {
	b := make([]byte, 4+reqFixed+len(q.ref))
	binary.LittleEndian.PutUint32(b, uint32(reqFixed+len(q.ref)))
	b[4] = q.op
	binary.LittleEndian.PutUint64(b[8:], uint64(q.until))
	copy(b[4+reqFixed:], q.ref)
	return b
}

// readRequest parses one request; a frame out of bounds is refused
// before its body is read.
func readRequest(r io.Reader) (request, error) {
	var lb [4 + reqFixed]byte
	if _, err := io.ReadFull(r, lb[:4]); err != nil {
		return request{}, err
	}
	n := int(binary.LittleEndian.Uint32(lb[:4]))
	if n < reqFixed || n > reqFixed+maxRef {
		return request{}, fmt.Errorf("%w: request of %d bytes", errFrame, n)
	}
	if _, err := io.ReadFull(r, lb[4:]); err != nil {
		return request{}, err
	}
	h := lb[4:]
	q := request{op: h[0], until: int64(binary.LittleEndian.Uint64(h[4:]))}
	if (q.op != opPull && q.op != opExtend) || h[1] != 0 || h[2] != 0 || h[3] != 0 {
		return request{}, fmt.Errorf("%w: op %d, flags %d", errFrame, h[0], h[1])
	}
	rb := make([]byte, n-reqFixed)
	if _, err := io.ReadFull(r, rb); err != nil {
		return request{}, err
	}
	q.ref = string(rb)
	return q, nil
}

type response struct {
	code             uint8
	ok               bool // extend
	bucket, key, msg string
	size             uint64
}

func (p *response) header() []byte {
	bl, kl, ml := min(len(p.bucket), math.MaxUint16), min(len(p.key), math.MaxUint16), min(len(p.msg), math.MaxUint16)
	b := make([]byte, 4+respFixed+bl+kl+ml)
	binary.LittleEndian.PutUint32(b, uint32(respFixed+bl+kl+ml))
	h := b[4:]
	h[0] = p.code
	if p.ok {
		h[1] = 1
	}
	binary.LittleEndian.PutUint16(h[2:], uint16(bl))
	binary.LittleEndian.PutUint16(h[4:], uint16(kl))
	binary.LittleEndian.PutUint16(h[6:], uint16(ml))
	binary.LittleEndian.PutUint64(h[8:], p.size)
	copy(h[respFixed:], p.bucket[:bl])
	copy(h[respFixed+bl:], p.key[:kl])
	copy(h[respFixed+bl+kl:], p.msg[:ml])
	return b
}

// readResponse parses a response's header (its body, if any, follows).
func readResponse(r *bufio.Reader) (response, error) {
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return response{}, err
	}
	n := int(binary.LittleEndian.Uint32(lb[:]))
	if n < respFixed || n > respFixed+maxNames {
		return response{}, fmt.Errorf("%w: response header of %d bytes", errFrame, n)
	}
	h := make([]byte, n)
	if _, err := io.ReadFull(r, h); err != nil {
		return response{}, err
	}
	bl, kl, ml := int(binary.LittleEndian.Uint16(h[2:])), int(binary.LittleEndian.Uint16(h[4:])), int(binary.LittleEndian.Uint16(h[6:]))
	p := response{code: h[0], ok: h[1]&1 != 0, size: binary.LittleEndian.Uint64(h[8:])}
	// A code this side does not know is a newer producer's error class
	// (the table is append only): refused, with its message (codeError).
	if respFixed+bl+kl+ml != n || h[1]&^1 != 0 {
		return response{}, fmt.Errorf("%w: code %d, flags %d, lengths %d+%d+%d in %d", errFrame, h[0], h[1], bl, kl, ml, n)
	}
	if p.size > MaxObject || (p.code != codeOK && p.size != 0) {
		return response{}, fmt.Errorf("%w: body of %d bytes (code %d)", errFrame, p.size, p.code)
	}
	s := h[respFixed:]
	p.bucket, p.key, p.msg = string(s[:bl]), string(s[bl:bl+kl]), string(s[bl+kl:])
	return p, nil
}
