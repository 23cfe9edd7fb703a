package localapi

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strings"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// The client half of objbytes.go: small puts and every get on the object
// socket, when the sidecar's hello says it serves them.

// putBytes puts a small object in the request itself (op 4).
func (c *Client) putBytes(ctx context.Context, obj []byte, req *sidecarv1.PutRequest) (*sidecarv1.PutResponse, error) {
	session := req.GetSession()
	if len(session) > maxObjRequest-objPutBytesFixed {
		return nil, fmt.Errorf("session name of %d bytes", len(session))
	}
	bp := objBuffers.Get().(*[]byte)
	defer objBuffers.Put(bp)
	msg := append((*bp)[:0], objMagic[:]...)
	msg = append(msg, objPutBytes)
	msg = binary.LittleEndian.AppendUint32(msg, req.GetReads())
	msg = binary.LittleEndian.AppendUint64(msg, uint64(req.GetTtlMs()))
	msg = binary.LittleEndian.AppendUint16(msg, uint16(len(session)))
	msg = append(msg, session...)
	msg = append(msg, obj...)
	body, fds, err := c.obj.send(ctx, msg, -1)
	samenode.CloseFDs(fds)
	if err != nil {
		return nil, err
	}
	return &sidecarv1.PutResponse{Ref: string(body), Size: int64(len(obj))}, nil
}

// getAny gets a referenced object in one message each way (op 5): its
// bytes when small, else a file of the directory lent to this client, or
// its sealed memfd on the same-node path; mapped as GetMapped maps them.
// The lendings released since the last call go with it (once, whatever
// the call's fate, as with the gRPC Get).
func (c *Client) getAny(ctx context.Context, ref string) (*sidecarv1.GetResponse, *Mapped, error) {
	c.mu.Lock()
	released := c.released
	c.released = nil
	c.mu.Unlock()
	rel := strings.Join(released, ",")
	if len(rel) > 0xFFFF {
		rel = "" // unreachable: at most maxLent tokens; the sidecar forgets them in time
	}
	if len(ref)+len(rel) > maxObjRequest {
		return nil, nil, fmt.Errorf("%w: a reference of %d bytes", ErrBadPayload, len(ref))
	}
	msg := make([]byte, 0, 1+objGetFixed+len(rel)+len(ref))
	msg = append(msg, objGetAny, getLend)
	msg = binary.LittleEndian.AppendUint16(msg, uint16(len(rel)))
	msg = append(msg, rel...)
	msg = append(msg, ref...)
	body, fds, err := c.obj.roundTrip(ctx, msg, -1)
	if err != nil {
		samenode.CloseFDs(fds)
		return nil, nil, err
	}
	kind, resp, rest, ok := parseGetHead(body)
	if !ok || (kind == getMemfd) != (len(fds) == 1) || len(fds) > 1 {
		samenode.CloseFDs(fds)
		return nil, nil, errObjFrame
	}
	switch kind {
	case getInline:
		if int64(len(rest)) != resp.Size {
			return nil, nil, errObjFrame
		}
		resp.Object = inlinePayload(rest)
		return resp, &Mapped{Data: rest}, nil
	case getFile:
		if len(rest) < 2 {
			return nil, nil, errObjFrame
		}
		pl := int(binary.LittleEndian.Uint16(rest))
		if len(rest) < 2+pl || pl == 0 {
			return nil, nil, errObjFrame
		}
		resp.Object = pathPayload(string(rest[2 : 2+pl]))
		m, err := c.mapPayload(resp.Object, resp.Size, string(rest[2+pl:]))
		return resp, m, err
	case getMemfd:
		if len(rest) != 0 {
			samenode.CloseFDs(fds)
			return nil, nil, errObjFrame
		}
		m, err := c.mapMemfd(os.NewFile(uintptr(fds[0]), "memfd:get"), resp.Size)
		return resp, m, err
	}
	samenode.CloseFDs(fds)
	return nil, nil, errObjFrame
}

// parseGetHead reads an op 5 answer's kind, size and source.
func parseGetHead(b []byte) (kind byte, resp *sidecarv1.GetResponse, rest []byte, ok bool) {
	if len(b) < 11 {
		return 0, nil, nil, false
	}
	kind = b[0]
	size := binary.LittleEndian.Uint64(b[1:])
	sl := int(binary.LittleEndian.Uint16(b[9:]))
	if len(b) < 11+sl || size > 1<<62 {
		return 0, nil, nil, false
	}
	return kind, &sidecarv1.GetResponse{Size: int64(size), Source: string(b[11 : 11+sl])}, b[11+sl:], true
}

// Ping makes one round trip on the object socket (its hello): the part
// of a small put's or get's time that is the sidecar being another
// process (bench/dataplane's SDK floor).
func (c *Client) Ping(ctx context.Context) error {
	_, fds, err := c.obj.roundTrip(ctx, []byte{objHello}, -1)
	samenode.CloseFDs(fds)
	return err
}
