package messaging

// The receiving end of a peer sidecar's message stream (stream.go has the
// frame and the sending end).

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/streamio"
)

// ServeStream reads messages from one peer's stream (after its magic)
// until it ends, and queues them for this pod's members.
//
// The stream is refused (closed at once, counted and logged) when this
// sidecar already serves MaxStreams of them, and closed when its first
// header has not come within HandshakeTimeout of its magic. A message
// for a member whose inbox is full is not read until the inbox has room
// (admit): the reader stops reading the stream, and TCP's flow control
// holds the sender back. A panic (a peer's bytes the code did not
// expect) ends this stream, not the sidecar.
func (r *Router) ServeStream(c net.Conn) {
	defer c.Close()
	if !r.openStream(c) {
		return
	}
	defer r.closeStream(c)
	var mb *member // the member whose inbox keeps room for the message being read
	var size uint64
	defer func() {
		if v := recover(); v != nil {
			recovered("stream", fmt.Sprintf("the message stream from %s", c.RemoteAddr()), v)
			// The room kept for the message goes back. On a goroutine of
			// its own: if the panic left the router's lock taken, that
			// goroutine waits for ever (as every other user of the lock
			// would) and this stream's cleanup still runs; a TryLock
			// here would also fail, and leak the room, whenever another
			// goroutine merely held the lock at that moment.
			if mb != nil {
				go func(mb *member, size uint64) {
					r.mu.Lock()
					defer r.mu.Unlock()
					r.unreserveLocked(mb, size)
					mb.roomChanged()
				}(mb, size)
			}
		}
	}()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = c.SetReadDeadline(time.Now().Add(r.handshakeTimeout()))
	raw := Raw(c)
	br := bufio.NewReaderSize(raw, 64<<10)
	var hr headerReader
	answer := func(id uint64, st Status) {
		var b [answerLen]byte
		binary.LittleEndian.PutUint64(b[:], id)
		b[8] = byte(st)
		_, _ = raw.Write(b[:])
	}
	authOK := map[authID]time.Time{} // this stream's checked authenticators
	for first := true; ; first = false {
		w, err := hr.read(br)
		if err != nil {
			if first && errors.Is(err, os.ErrDeadlineExceeded) {
				streamsRefused.WithLabelValues("handshake_timeout").Inc()
				logLimited("handshake", "message stream from %s closed: no message header within %v of its magic", c.RemoteAddr(), r.handshakeTimeout())
			}
			return
		}
		if first {
			_ = c.SetReadDeadline(time.Time{})
		}
		st := r.check(authOK, &w)
		if st == Queued {
			if st, mb, err = r.admit(c, &w); err != nil {
				return
			}
			size = w.size
		}
		m := Message{Session: w.session, Group: w.group, From: w.from, To: w.to, Tag: w.tag, Seq: w.seq, Size: w.size}
		st, err = r.readBody(br, c, &m, st)
		switch {
		case err != nil:
			r.unreserveFailed(mb, size)
			return
		case st != Queued:
			r.unreserve(mb, size)
			mb = nil
			answer(w.id, st)
			continue
		}
		held := mb
		mb = nil
		answer(w.id, r.accept(m, held))
	}
}

// authID is an authenticator checked for a group.
type authID struct{ auth, session, group string }

// check opens a message's authenticator (once per stream and token).
func (r *Router) check(ok map[authID]time.Time, w *wire) Status {
	id := authID{w.auth, w.session, w.group}
	now := r.now()
	if exp, seen := ok[id]; seen && now.Before(exp) {
		return Queued
	}
	kr := r.cfg.Keys()
	if kr == nil {
		return NotHere
	}
	rec, err := kr.Open(w.auth, now)
	if err != nil || rec.Key != authKey(w.session, w.group) {
		refusedForeign.Inc()
		return Foreign
	}
	if len(ok) > 1024 {
		clear(ok)
	}
	ok[id] = rec.Expires
	return Queued
}

// readBody reads a message's body: into memory when small, else into a
// new file of the object directory; discarded unless st is Queued (or when
// no file can be made: Refused).
func (r *Router) readBody(br *bufio.Reader, c net.Conn, m *Message, st Status) (Status, error) {
	discard := func(st Status) (Status, error) {
		_, err := io.CopyN(io.Discard, br, int64(m.Size))
		return st, err
	}
	if st != Queued {
		return discard(st)
	}
	if m.Size <= uint64(r.cfg.inlineMax()) || r.cfg.NewFile == nil {
		switch {
		case m.Size > maxInMemory:
			return discard(Refused)
		case m.Size > memPrealloc:
			var err error
			m.Data, err = readGrowing(br, int(m.Size))
			return Queued, err
		}
		m.Data = GetBuf(int(m.Size)) // back to the pool once a function has it (localapi's fast path)
		return Queued, streamio.ReadFull(br, c, m.Data)
	}
	if int64(m.Size) < 0 || int64(int(m.Size)) != int64(m.Size) {
		return discard(Refused)
	}
	f, err := r.cfg.NewFile(int64(m.Size))
	if err != nil {
		return discard(Refused) // e.g. streamio.ErrNoRoom: the directory is full
	}
	// The socket's bytes go straight into the file's pages (one copy).
	if err := streamio.ReadFull(br, c, f.Mem()[:m.Size]); err != nil {
		f.Discard()
		return 0, err
	}
	m.Path, m.File = f.Path(), f
	return Queued, nil
}

// A body kept in memory (no object directory: Config.NewFile nil) is
// allocated up to memPrealloc at its header and grown as its bytes come
// beyond that, so a peer cannot make the sidecar allocate what it did not
// send; one over maxInMemory is refused.
const (
	memPrealloc = 16 << 20
	maxInMemory = 1 << 30
)

func readGrowing(br *bufio.Reader, size int) ([]byte, error) {
	data := make([]byte, 0, memPrealloc)
	for len(data) < size {
		if len(data) == cap(data) {
			data = slices.Grow(data, min(len(data), size-len(data)))
		}
		n := min(cap(data), size) - len(data)
		k, err := io.ReadFull(br, data[len(data):len(data)+n])
		data = data[:len(data)+k]
		if err != nil {
			return nil, err
		}
	}
	return data, nil
}
