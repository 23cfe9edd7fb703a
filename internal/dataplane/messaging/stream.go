package messaging

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/streamio"
)

// The message stream between sidecars: one TCP connection per peer, on
// the data-plane port (the listener tells it from the pull stream by its
// first four bytes, StreamMagic). Each message is a header and its body
// straight after it: a large body goes from the sender's shared-memory
// file to the socket with sendfile, and from the socket into a new
// shared-memory file at the receiver, so neither sidecar copies it
// through its heap. The receiver answers each message with a status
// (queued, not here, foreign) once it has queued it, or once its full
// queue has room again (back-pressure); answers may come out of order and
// carry the message's id.
//
//	header: u32 length of the rest of the header, u8 type (1), u8 flags,
//	        u16 auth, session and group lengths, u32 from, u32 to, i64 tag,
//	        u64 seq, u64 id, u64 body size, then the three strings
//	answer: u64 id, u8 status

// StreamMagic starts a message stream.
var StreamMagic = [4]byte{'Z', 'T', 'M', '1'}

// Status is the receiver's answer to a delivery.
type Status uint8

// The answers of a delivery.
const (
	Queued  Status = iota
	NotHere        // the receiver's rank does not run in that pod (left, or never joined there)
	Foreign        // the authenticator is not of that pod's namespace and group
	Refused        // the receiving pod could not store the message (its object directory)
)

const (
	headerFixed = 1 + 1 + 2 + 2 + 2 + 4 + 4 + 8 + 8 + 8 + 8
	maxStrings  = 3 << 10
	maxBody     = 1 << 40
	answerLen   = 9
)

// ErrUnreachable: the peer's sidecar cannot be reached, or its stream
// broke before it answered.
var ErrUnreachable = errors.New("peer sidecar unreachable")

// wire is one message on the stream.
type wire struct {
	auth, session, group string
	from, to             uint32
	tag                  int64
	seq, id, size        uint64
}

func (w *wire) header() []byte { return w.appendHeader(nil) }

// appendHeader appends the header to b.
func (w *wire) appendHeader(b []byte) []byte {
	n := headerFixed + len(w.auth) + len(w.session) + len(w.group)
	at := len(b)
	b = slices.Grow(b, 4+n)[:at+4+n]
	f := b[at:]
	clear(f[:4+headerFixed])
	binary.LittleEndian.PutUint32(f, uint32(n))
	h := f[4:]
	h[0] = 1
	binary.LittleEndian.PutUint16(h[2:], uint16(len(w.auth)))
	binary.LittleEndian.PutUint16(h[4:], uint16(len(w.session)))
	binary.LittleEndian.PutUint16(h[6:], uint16(len(w.group)))
	binary.LittleEndian.PutUint32(h[8:], w.from)
	binary.LittleEndian.PutUint32(h[12:], w.to)
	binary.LittleEndian.PutUint64(h[16:], uint64(w.tag))
	binary.LittleEndian.PutUint64(h[24:], w.seq)
	binary.LittleEndian.PutUint64(h[32:], w.id)
	binary.LittleEndian.PutUint64(h[40:], w.size)
	copy(h[headerFixed:], w.auth)
	copy(h[headerFixed+len(w.auth):], w.session)
	copy(h[headerFixed+len(w.auth)+len(w.session):], w.group)
	return b
}

var errFrame = errors.New("malformed message frame")

// headerReader reads a stream's headers, reusing its buffer and the
// previous header's strings when they repeat (one group's messages).
type headerReader struct {
	buf  []byte
	prev wire
}

func (hr *headerReader) read(r *bufio.Reader) (wire, error) {
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return wire{}, err
	}
	n := int(binary.LittleEndian.Uint32(lb[:]))
	if n < headerFixed || n > headerFixed+maxStrings {
		return wire{}, fmt.Errorf("%w: header of %d bytes", errFrame, n)
	}
	if cap(hr.buf) < n {
		hr.buf = make([]byte, headerFixed+maxStrings)
	}
	h := hr.buf[:n]
	if _, err := io.ReadFull(r, h); err != nil {
		return wire{}, err
	}
	al, sl, gl := int(binary.LittleEndian.Uint16(h[2:])), int(binary.LittleEndian.Uint16(h[4:])), int(binary.LittleEndian.Uint16(h[6:]))
	if h[0] != 1 || headerFixed+al+sl+gl != n {
		return wire{}, fmt.Errorf("%w: type %d, lengths %d+%d+%d in %d", errFrame, h[0], al, sl, gl, n)
	}
	w := wire{from: binary.LittleEndian.Uint32(h[8:]), to: binary.LittleEndian.Uint32(h[12:]), tag: int64(binary.LittleEndian.Uint64(h[16:])),
		seq: binary.LittleEndian.Uint64(h[24:]), id: binary.LittleEndian.Uint64(h[32:]), size: binary.LittleEndian.Uint64(h[40:])}
	if w.size > maxBody {
		return wire{}, fmt.Errorf("%w: body of %d bytes", errFrame, w.size)
	}
	s := h[headerFixed:]
	w.auth, w.session, w.group = same(hr.prev.auth, s[:al]), same(hr.prev.session, s[al:al+sl]), same(hr.prev.group, s[al+sl:])
	hr.prev = w
	return w, nil
}

// same is b as a string: prev when equal (no allocation).
func same(prev string, b []byte) string {
	if prev == string(b) {
		return prev
	}
	return string(b)
}

// --- sender side ------------------------------------------------------------

// Streams keeps one message stream per peer address.
type Streams struct {
	mu    sync.Mutex
	peers map[string]*peerStream
}

type peerStream struct {
	conn    net.Conn
	raw     io.ReadWriter // conn's raw reads and writes (Raw)
	wmu     sync.Mutex
	wbuf    []byte // under wmu
	mu      sync.Mutex
	nextID  uint64
	waiting map[uint64]answerFunc
	dead    chan struct{}
	err     error
}

// answerFunc gets a delivery's answer, or ErrUnreachable when the stream
// ended before it came.
type answerFunc func(Status, error)

func (s *Streams) peer(ctx context.Context, addr string) (*peerStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.peers[addr]; p != nil {
		select {
		case <-p.dead:
			delete(s.peers, addr)
		default:
			return p, nil
		}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, addr, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if _, err := c.Write(StreamMagic[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, addr, err)
	}
	p := &peerStream{conn: c, raw: Raw(c), waiting: map[uint64]answerFunc{}, dead: make(chan struct{})}
	if s.peers == nil {
		s.peers = map[string]*peerStream{}
	}
	s.peers[addr] = p
	go p.answers(addr)
	return p, nil
}

// live is the open stream to addr, or nil when there is none (a send
// that must dial first takes the slow path).
func (s *Streams) live(addr string) *peerStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.peers[addr]; p != nil {
		select {
		case <-p.dead:
		default:
			return p
		}
	}
	return nil
}

// answers reads the peer's answers until the stream ends, and hands each
// to its delivery's answerFunc right here: a waiting function's sidecar
// answers it from this goroutine, with no hand-off to another.
func (p *peerStream) answers(addr string) {
	r := bufio.NewReader(p.raw)
	var b [answerLen]byte
	var err error
	for {
		if _, err = io.ReadFull(r, b[:]); err != nil {
			break
		}
		id := binary.LittleEndian.Uint64(b[:])
		p.mu.Lock()
		fn := p.waiting[id]
		delete(p.waiting, id)
		p.mu.Unlock()
		if fn != nil {
			fn(Status(b[8]), nil)
		}
	}
	p.mu.Lock()
	p.err = err
	close(p.dead)
	waiting := p.waiting
	p.waiting = map[uint64]answerFunc{}
	p.mu.Unlock()
	p.conn.Close()
	for _, fn := range waiting {
		fn(0, fmt.Errorf("%w: %s: the stream ended before the answer", ErrUnreachable, addr))
	}
}

// broken drops the stream: answers() sees it and closes dead.
func (p *peerStream) broken() { p.conn.Close() }

// send writes one message (body: data, or size bytes of file from its
// start) and registers fn for its answer. fn is called once, from the
// stream's reader, unless send returns an error or forget(id) returns
// true.
func (p *peerStream) send(auth string, m *Message, file *os.File, fn answerFunc) (uint64, error) {
	p.mu.Lock()
	select {
	case <-p.dead:
		p.mu.Unlock()
		return 0, fmt.Errorf("%w: the stream ended", ErrUnreachable)
	default:
	}
	p.nextID++
	id := p.nextID
	p.waiting[id] = fn
	p.mu.Unlock()
	w := wire{auth: auth, session: m.Session, group: m.Group, from: m.From, to: m.To, tag: m.Tag, seq: m.Seq, id: id, size: m.Size}
	if file == nil {
		w.size = uint64(len(m.Data))
	}
	p.wmu.Lock()
	err := writeMessage(p.conn, p.raw, &p.wbuf, &w, m.Data, file)
	p.wmu.Unlock()
	if err != nil {
		p.broken()
		if p.forget(id) {
			return 0, fmt.Errorf("%w: %v", ErrUnreachable, err)
		}
		// The reader took it first: fn gets ErrUnreachable from there.
	}
	return id, nil
}

// forget drops a delivery's answerFunc: true when it had not been called
// (and now will not be).
func (p *peerStream) forget(id uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.waiting[id]
	delete(p.waiting, id)
	return ok
}

// Deliver sends one message (body: data, or size bytes of file from its
// start) and waits for the receiver's answer.
func (s *Streams) Deliver(ctx context.Context, addr, auth string, m Message, file *os.File) (Status, error) {
	p, err := s.peer(ctx, addr)
	if err != nil {
		return 0, err
	}
	type answer struct {
		st  Status
		err error
	}
	ch := make(chan answer, 1)
	id, err := p.send(auth, &m, file, func(st Status, err error) { ch <- answer{st, err} })
	if err != nil {
		return 0, fmt.Errorf("%s: %w", addr, err)
	}
	select {
	case a := <-ch:
		return a.st, a.err
	case <-ctx.Done():
		if !p.forget(id) {
			a := <-ch
			return a.st, a.err
		}
		return 0, ctx.Err()
	}
}

// joinMax bounds the bodies copied behind their header into one write
// (larger ones go out with writev, or sendfile from their file).
const joinMax = 4 << 10

// writeMessage writes a message, a small one in one raw write; buf is
// the stream's scratch buffer (under its write lock), grown as needed.
func writeMessage(c net.Conn, raw io.Writer, buf *[]byte, w *wire, data []byte, file *os.File) error {
	if file == nil && len(data) <= joinMax {
		b := append(w.appendHeader((*buf)[:0]), data...)
		*buf = b
		_, err := raw.Write(b)
		return err
	}
	h := w.header()
	if file == nil {
		bufs := net.Buffers{h, data}
		_, err := bufs.WriteTo(c)
		return err
	}
	if _, err := c.Write(h); err != nil {
		return err
	}
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		return err
	}
	// *net.TCPConn reads from an *os.File with sendfile(2).
	n, err := io.Copy(c, io.LimitReader(file, int64(w.size)))
	if err == nil && uint64(n) != w.size {
		err = fmt.Errorf("file ended after %d of %d bytes", n, w.size)
	}
	return err
}

// Close ends every stream.
func (s *Streams) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for a, p := range s.peers {
		p.conn.Close()
		delete(s.peers, a)
	}
}

// --- receiver side ----------------------------------------------------------

// ServeStream reads messages from one peer's stream (after its magic)
// until it ends, and queues them for this pod's members.
func (r *Router) ServeStream(c net.Conn) {
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	raw := Raw(c)
	br := bufio.NewReaderSize(raw, 64<<10)
	var hr headerReader
	var wmu sync.Mutex
	answer := func(id uint64, st Status) {
		var b [answerLen]byte
		binary.LittleEndian.PutUint64(b[:], id)
		b[8] = byte(st)
		wmu.Lock()
		_, _ = raw.Write(b[:])
		wmu.Unlock()
	}
	authOK := map[authID]time.Time{} // this stream's checked authenticators
	for {
		w, err := hr.read(br)
		if err != nil {
			return
		}
		st := r.check(authOK, &w)
		m := Message{Session: w.session, Group: w.group, From: w.from, To: w.to, Tag: w.tag, Seq: w.seq, Size: w.size}
		if st, err = r.readBody(br, c, &m, st); err != nil {
			return
		}
		if st != Queued {
			answer(w.id, st)
			continue
		}
		st, wait := r.accept(m)
		if wait == nil {
			answer(w.id, st)
			continue
		}
		go func(id uint64) {
			_ = wait(context.Background())
			answer(id, st)
		}(w.id)
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
