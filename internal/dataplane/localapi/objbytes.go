package localapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
)

// Small objects on the object socket (objsock.go): a put of bytes and a
// get that answers with whatever the object is, so that neither travels
// through gRPC. A gRPC call over the unix socket costs a function ~100 µs
// of both pods' CPU (HTTP/2 framing, three goroutines a side, header
// maps); one SOCK_SEQPACKET message each way costs ~10 µs, which is what
// keeps a put and a get of 10 KB near the bare pull (bench_test.go,
// BenchmarkPutGet against BenchmarkBarePull).
//
//	request:  "ZTO1", u8 op, then
//	          op 4 put bytes: u32 reads, i64 ttl ms, u16 session length,
//	                          session, the object (at most objInlineMax)
//	          op 5 get:       u8 flags (bit 0: lend a file), u16 length of
//	                          the released lendings, the lendings (comma
//	                          separated, as the gRPC metadata
//	                          "ziptrail-release"), the reference
//	response: "ZTO1", u8 status, then
//	          ok put bytes:   the reference
//	          ok get:         u8 kind, u64 size, u16 source length, source,
//	                          then by kind: 0 the object's bytes; 1 u16 path
//	                          length, path, the lending's token ("" when
//	                          the file is the caller's own); 2 nothing, one
//	                          descriptor (a sealed memfd, as op 3 gives)
//	          error:          as for the other ops
//
// The hello's flags bit 1 says a sidecar serves ops 4 and 5; an SDK uses
// them only then (an older sidecar ends the connection on an op it does
// not know), else the gRPC Put and Get, which stay the same.
const (
	objPutBytes = 4
	objGetAny   = 5

	helloBytes = 2

	getInline = 0
	getFile   = 1
	getMemfd  = 2

	getLend = 1

	// objInlineMax bounds the bytes of an op 4 put and of an op 5
	// answer's object (larger ones go as files): a message must fit the
	// socket's send buffer (~208 KiB by default).
	objInlineMax = 64 << 10
	// maxObjMessage bounds any object-socket message.
	maxObjMessage    = maxObjRequest + objInlineMax
	objPutBytesFixed = 4 + 8 + 2
	objGetFixed      = 1 + 2
)

// objBuffers holds message buffers: any object-socket message fits, and
// one byte more (a longer one is truncated, and refused).
var objBuffers = sync.Pool{New: func() any { b := make([]byte, maxObjMessage+1); return &b }}

// objPutBytes stores a small object sent in the request.
func (s *Server) objPutBytes(req []byte) []byte {
	resp, err := s.putBytes(req)
	countCall("Put", err)
	if err != nil {
		return errReply(err)
	}
	objFrames.WithLabelValues("put_bytes").Inc()
	return append(objHeader(objOK), resp.GetRef()...)
}

func (s *Server) putBytes(req []byte) (*sidecarv1.PutResponse, error) {
	if len(req) < objPutBytesFixed {
		return nil, fmt.Errorf("%w: short put request", ErrBadPayload)
	}
	reads := binary.LittleEndian.Uint32(req)
	ttl := int64(binary.LittleEndian.Uint64(req[4:]))
	sl := int(binary.LittleEndian.Uint16(req[12:]))
	if len(req) < objPutBytesFixed+sl {
		return nil, fmt.Errorf("%w: put request of %d bytes, session of %d", ErrBadPayload, len(req), sl)
	}
	session := string(req[objPutBytesFixed : objPutBytesFixed+sl])
	data := req[objPutBytesFixed+sl:]
	if len(data) > objInlineMax {
		return nil, fmt.Errorf("%w: %d bytes sent inline on the object socket, at most %d", ErrBadPayload, len(data), objInlineMax)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.putWait())
	defer cancel()
	// The request's buffer is the connection's: the store keeps a copy.
	return s.Put(ctx, &sidecarv1.PutRequest{Reads: reads, TtlMs: ttl, Session: session,
		Object: inlinePayload(bytes.Clone(data))})
}

// lendSlot carries an object-socket get's lending through Get: the
// tokens the caller released, and the token of the file lent to it.
type lendSlot struct {
	released []string
	token    string
}

type lendSlotKey struct{}

func lendingSlot(ctx context.Context) *lendSlot {
	slot, _ := ctx.Value(lendSlotKey{}).(*lendSlot)
	return slot
}

// inlineInto, in a get's context, gives the buffer an inline object is
// read or pulled into: the object socket's answer, its header before it
// (no copy from a first buffer into the message).
type inlineInto func(size int, source string) []byte

type inlineIntoKey struct{}

// inlineBuffer is a buffer of size bytes for a get's inline object.
func inlineBuffer(ctx context.Context, size int, source string) []byte {
	if into, ok := ctx.Value(inlineIntoKey{}).(inlineInto); ok {
		if b := into(size, source); b != nil {
			return b
		}
	}
	return make([]byte, size)
}

// objGetAny answers a get whatever the object is: its memfd when there
// is one (as op 3), else as the gRPC Get would (inline bytes, or a file
// of the directory, lent when asked). fd is the memfd to send, or nil.
func (s *Server) objGetAny(req, reply []byte) ([]byte, *os.File) {
	if len(req) < objGetFixed {
		return errReply(fmt.Errorf("%w: short get request", ErrBadPayload)), nil
	}
	flags := req[0]
	rl := int(binary.LittleEndian.Uint16(req[1:]))
	if len(req) < objGetFixed+rl {
		return errReply(fmt.Errorf("%w: get request of %d bytes, releases of %d", ErrBadPayload, len(req), rl)), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	slot := &lendSlot{}
	if rl > 0 {
		slot.released = strings.Split(string(req[objGetFixed:objGetFixed+rl]), ",")
	}
	r := req[objGetFixed+rl:]
	// The releases count whatever the answer (a memfd's too).
	s.files(context.WithValue(ctx, lendSlotKey{}, slot))
	if s.SameNodeGet != nil || s.Adopter != nil {
		switch out, f := s.objGet(r); {
		case f != nil:
			countCall("Get", nil)
			return append(append(objHeader(objOK), getMemfd), out[5:]...), f
		case out[4] == objError:
			countCall("Get", objStatus(out[5:]))
			return out, nil
		}
	}
	if flags&getLend != 0 {
		ctx = context.WithValue(ctx, lendSlotKey{}, slot)
	}
	// A small object is read (or pulled) straight into the answer, in
	// the reply buffer the caller took for it.
	var msg []byte
	ctx = context.WithValue(ctx, inlineIntoKey{}, inlineInto(func(size int, source string) []byte {
		head := getHead(append(reply[:0], objMagic[:]...), objOK, getInline, int64(size), source)
		if size > objInlineMax || len(head)+size > cap(reply) {
			return nil
		}
		msg = head[:len(head)+size]
		return msg[len(head):]
	}))
	resp, err := s.Get(ctx, &sidecarv1.GetRequest{Ref: string(r)})
	countCall("Get", err)
	if err != nil {
		return errReply(err), nil
	}
	out := objHeader(objOK)
	switch p := resp.GetObject().GetSource().(type) {
	case *sidecarv1.Payload_Inline:
		if len(p.Inline) <= objInlineMax {
			objFrames.WithLabelValues("get_bytes").Inc()
			if msg != nil && len(p.Inline) > 0 && &msg[len(msg)-len(p.Inline)] == &p.Inline[0] {
				return msg, nil
			}
			return append(getHead(out[:4], objOK, getInline, resp.GetSize(), resp.GetSource()), p.Inline...), nil
		}
		// The sidecar's inline threshold is above what a message takes.
		files := s.files(ctx)
		pf, err := files.take(int64(len(p.Inline)))
		if err == nil {
			if _, err = pf.f.WriteAt(p.Inline, 0); err != nil {
				pf.drop()
			}
		}
		if err != nil {
			return errReply(err), nil
		}
		slot.token = ""
		path := s.handOut(ctx, files, pf).GetPath()
		return fileReply(out, resp, path, slot.token), nil
	case *sidecarv1.Payload_Path:
		return fileReply(out, resp, p.Path, slot.token), nil
	}
	return errReply(fmt.Errorf("local API: response without an object")), nil
}

func getHead(b []byte, st, kind byte, size int64, source string) []byte {
	b = append(b, st, kind)
	b = binary.LittleEndian.AppendUint64(b, uint64(size))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(source)))
	return append(b, source...)
}

func fileReply(b []byte, resp *sidecarv1.GetResponse, path, token string) []byte {
	objFrames.WithLabelValues("get_file").Inc()
	b = getHead(b[:4], objOK, getFile, resp.GetSize(), resp.GetSource())
	b = binary.LittleEndian.AppendUint16(b, uint16(len(path)))
	b = append(b, path...)
	return append(b, token...)
}
