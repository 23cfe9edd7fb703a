package ziptrail

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
)

// The collectives' messages, shared with the Python SDK (ziptrail/group.py)
// so that members of both languages can meet in one collective: a frame
//
//	version (1 byte, 1), type (1 byte: 0 data, 1 abort),
//	header length (uint16), data offset (uint64), little-endian
//
// then the header (data: the element format, "f8", "i8", or empty for
// bytes; abort: the JSON abortNote), then the data at the data offset:
// right after the header for a message sent inline, or at the next page
// boundary for one that passes through a file, so that the receiver maps
// the data straight from the file.

const (
	frameVersion = 1
	frameSize    = 12

	frameData  byte = 0
	frameAbort byte = 1
)

var pageSize = os.Getpagesize()

func frameHead(typ byte, hdr []byte, off int) []byte {
	b := make([]byte, frameSize, frameSize+len(hdr))
	b[0], b[1] = frameVersion, typ
	binary.LittleEndian.PutUint16(b[2:], uint16(len(hdr)))
	binary.LittleEndian.PutUint64(b[4:], uint64(off))
	return append(b, hdr...)
}

// inlineFrame is a whole message in one slice.
func inlineFrame(typ byte, hdr, data []byte) []byte {
	b := frameHead(typ, hdr, frameSize+len(hdr))
	return append(b, data...)
}

var errBadFrame = errors.New("a malformed collective message (a member with another SDK version?)")

// parseHead reads a frame's head; size is the whole message's.
func parseHead(head []byte, size int64) (typ byte, hdrLen int, off int64, err error) {
	if len(head) < frameSize {
		return 0, 0, 0, errBadFrame
	}
	typ, hdrLen, off = head[1], int(binary.LittleEndian.Uint16(head[2:])), int64(binary.LittleEndian.Uint64(head[4:]))
	if head[0] != frameVersion || (typ != frameData && typ != frameAbort) || off < int64(frameSize+hdrLen) || off > size {
		return 0, 0, 0, errBadFrame
	}
	return typ, hdrLen, off, nil
}

// parseInline splits an inline message.
func parseInline(raw []byte) (typ byte, hdr, data []byte, err error) {
	typ, hl, off, err := parseHead(raw, int64(len(raw)))
	if err != nil {
		return 0, nil, nil, err
	}
	return typ, raw[frameSize : frameSize+hl], raw[off:], nil
}

// readFrameFile reads a message the sidecar wrote into a file (and
// removes the file): its data is mapped when it starts at a page boundary.
func readFrameFile(path string) (typ byte, hdr []byte, m *Message, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, nil, err
	}
	defer f.Close()
	defer os.Remove(path)
	st, err := f.Stat()
	if err != nil {
		return 0, nil, nil, err
	}
	head := make([]byte, frameSize)
	if _, err := io.ReadFull(f, head); err != nil {
		return 0, nil, nil, errBadFrame
	}
	typ, hl, off, err := parseHead(head, st.Size())
	if err != nil {
		return 0, nil, nil, err
	}
	hdr = make([]byte, hl)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return 0, nil, nil, errBadFrame
	}
	n := st.Size() - off
	m = &Message{Size: n}
	switch {
	case n == 0:
		m.data = []byte{}
	case off%int64(pageSize) == 0:
		data, err := syscall.Mmap(int(f.Fd()), off, int(n), syscall.PROT_READ, syscall.MAP_SHARED)
		if err != nil {
			return 0, nil, nil, fmt.Errorf("map %s: %w", path, err)
		}
		m.data, m.buf = data, data
	default:
		m.data = make([]byte, n)
		if _, err := f.ReadAt(m.data, off); err != nil {
			return 0, nil, nil, err
		}
	}
	return typ, hdr, m, nil
}

// csend sends one collective message to each of dests, in order: into
// the direct channel of a same-node dest, else through the sidecar; a
// large one for the sidecar is written once into a file and hard-linked
// for the other requests (the sidecar takes over each request's file).
func (g *Group) csend(ctx context.Context, dests []int, tag int64, typ byte, hdr, data []byte) error {
	if len(dests) == 0 {
		return nil
	}
	var raw []byte // the inline frame, made once
	// A large frame for the sidecar: written once into a file of this
	// client's, which each send gives back unchanged for the next one
	// (docs/messaging.md, "Reused files").
	var path, name string
	defer func() {
		if name != "" {
			g.c.api.MessageSent(name, true)
		}
	}()
	for _, d := range dests {
		if g.att != nil {
			if err := g.checkRank("send", d); err != nil {
				return err
			}
			c, err := g.att.path(ctx, "send", d)
			if err != nil {
				return err
			}
			if c != nil {
				if raw == nil {
					raw = inlineFrame(typ, hdr, data)
				}
				if err := g.att.sendDirect(ctx, "send", c, d, tag, raw); err != nil {
					return err
				}
				continue
			}
		}
		if frameSize+len(hdr)+len(data) <= g.c.api.InlineThreshold {
			if raw == nil {
				raw = inlineFrame(typ, hdr, data)
			}
			if err := g.send(ctx, "send", d, tag, raw, ""); err != nil {
				return err
			}
			continue
		}
		if err := g.checkRank("send", d); err != nil {
			return err
		}
		if name == "" {
			var err error
			if path, name, err = g.frameFile(typ, hdr, data); err != nil {
				return &Error{Kind: KindInternal, Op: "send", Err: fmt.Errorf("write to the shared-memory directory: %w", err)}
			}
		}
		_, returned, err := g.c.messages().SendFile(ctx, g.session, g.name, uint32(g.rank), uint32(d), tag, path)
		if err != nil || !returned {
			g.c.api.MessageSent(name, false) // the next dest gets a new file
			path, name = "", ""
		}
		if err != nil {
			return peerError(messageError(ctx, "send", err), d)
		}
	}
	return nil
}

// frameFile writes a collective message into a file for SendFile (a
// reused one when there is one), its data at a page boundary; the bytes
// before the data are all the frame's (no earlier message's).
func (g *Group) frameFile(typ byte, hdr, data []byte) (path, name string, err error) {
	off := (frameSize + len(hdr) + pageSize - 1) / pageSize * pageSize
	head := frameHead(typ, hdr, off)
	head = append(head, make([]byte, off-len(head))...)
	size := int64(off + len(data))
	if len(data) == 0 {
		size = int64(off)
	}
	return g.c.api.MessageFile(size, localapi.Part{Data: head}, localapi.Part{Off: int64(off), Data: data})
}

// crecv receives one collective message.
func (g *Group) crecv(ctx context.Context, from int, tag int64) (typ byte, hdr []byte, m *Message, err error) {
	resp, err := g.recvRaw(ctx, "recv", from, tag, false)
	if err != nil {
		return 0, nil, nil, err
	}
	switch {
	case resp.token != "":
		// A lent file, mapped at its push: parsed in place.
		err = resp.ferr
		if err == nil {
			var data []byte
			if typ, hdr, data, err = parseInline(resp.fmap); err == nil {
				m = &Message{data: data, Size: int64(len(data)), buf: resp.fmap, back: resp.giveBack()}
			}
		}
		if err != nil {
			resp.release()
		}
	case resp.path != "":
		typ, hdr, m, err = readFrameFile(resp.path)
	default:
		var data []byte
		typ, hdr, data, err = parseInline(resp.data)
		m = &Message{data: data, Size: int64(len(data)), buf: resp.mapping, memfd: resp.mapping != nil}
		if err != nil {
			resp.release()
		}
	}
	if err != nil {
		return 0, nil, nil, &Error{Kind: KindInternal, Op: "recv", Err: fmt.Errorf("from rank %d: %w", from, err)}
	}
	m.From = from
	return typ, hdr, m, nil
}
