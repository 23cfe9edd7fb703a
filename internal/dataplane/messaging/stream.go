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
	"sync/atomic"
	"syscall"
	"time"
)

// The message stream between sidecars: one TCP connection per peer, on
// the data-plane port (the listener tells it from the pull stream by its
// first four bytes, StreamMagic). Each message is a header and its body
// straight after it: a large body goes from the sender's shared-memory
// file to the socket with sendfile, and from the socket into a new
// shared-memory file at the receiver, so neither sidecar copies it
// through its heap. The receiver answers each message with a status
// (queued, not here, foreign, refused) once it has queued it; answers
// carry the message's id. A message for a member whose inbox is full is
// not read until the inbox has room: the receiver stops reading the
// stream, and TCP's flow control holds the sender back (back-pressure,
// inbox.go).
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

// Streams keeps one message stream per peer address. No lock is held
// across a network call: a dial runs on a goroutine of its own, one per
// address at a time; the deliveries to that address wait for it, each
// until its own context ends, and deliveries to other peers, over their
// open streams, go on meanwhile (issue 31: one unreachable peer stalled
// every delivery of the pod for as long as its dial lasted).
type Streams struct {
	mu    sync.Mutex
	peers map[string]*peerStream
	dials map[string]*dialing // under way
	// base is the dials' context: Close cancels it (and a new one is made
	// for later dials).
	base context.Context
	stop context.CancelFunc
}

// dialing is a dial under way; done is closed once p or err is set.
type dialing struct {
	done chan struct{}
	p    *peerStream
	err  error
}

// dialTimeout bounds one dial: a peer whose SYNs vanish (its node gone)
// is dialed again by the delivery's next try instead of waiting for the
// kernel's retransmissions (about two minutes).
const dialTimeout = 10 * time.Second

type peerStream struct {
	conn net.Conn
	raw  io.ReadWriter   // conn's raw reads and writes (Raw)
	rc   syscall.RawConn // conn's descriptor (nil: none, writes go through conn)
	// wslot is the write slot: one frame at a time, taken by a send
	// that may give up waiting for it (its context ends).
	wslot   chan struct{}
	wbuf    []byte      // under wslot
	fw      frameWriter // under wslot
	mu      sync.Mutex
	nextID  uint64
	waiting map[uint64]answerFunc
	dead    chan struct{}
	err     error
	// cut: this side broke the stream (broken); dead closes once the
	// reader sees it, but no send may take the stream meanwhile.
	cut atomic.Bool
}

// answerFunc gets a delivery's answer, or ErrUnreachable when the stream
// ended before it came.
type answerFunc func(Status, error)

func (p *peerStream) isDead() bool {
	if p.cut.Load() {
		return true
	}
	select {
	case <-p.dead:
		return true
	default:
		return false
	}
}

// peer is the open stream to addr, dialed when there is none: the dial
// is shared with the other deliveries to addr; this one waits for it
// until ctx ends.
func (s *Streams) peer(ctx context.Context, addr string) (*peerStream, error) {
	s.mu.Lock()
	if p := s.peers[addr]; p != nil {
		if !p.isDead() {
			s.mu.Unlock()
			return p, nil
		}
		delete(s.peers, addr)
	}
	d := s.dials[addr]
	if d == nil {
		if s.dials == nil {
			s.dials = map[string]*dialing{}
		}
		if s.base == nil {
			s.base, s.stop = context.WithCancel(context.Background())
		}
		d = &dialing{done: make(chan struct{})}
		s.dials[addr] = d
		go s.dial(s.base, addr, d)
	}
	s.mu.Unlock()
	select {
	case <-d.done:
		return d.p, d.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %s: waiting for its stream: %w", ErrUnreachable, addr, context.Cause(ctx))
	}
}

// dial opens a stream to addr for the deliveries waiting on d.
func (s *Streams) dial(base context.Context, addr string, d *dialing) {
	ctx, cancel := context.WithTimeout(base, dialTimeout)
	defer cancel()
	p, err := dialPeer(ctx, addr)
	s.mu.Lock()
	if s.dials[addr] == d {
		delete(s.dials, addr)
	}
	if err == nil && base.Err() != nil {
		// Closed meanwhile.
		p.broken()
		p, err = nil, fmt.Errorf("%w: %s: the streams were closed", ErrUnreachable, addr)
	}
	if err == nil {
		if s.peers == nil {
			s.peers = map[string]*peerStream{}
		}
		s.peers[addr] = p
	}
	d.p, d.err = p, err
	close(d.done)
	s.mu.Unlock()
}

func dialPeer(ctx context.Context, addr string) (*peerStream, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, addr, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	// Four bytes into a new socket: never blocks.
	if _, err := c.Write(StreamMagic[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, addr, err)
	}
	p := &peerStream{conn: c, raw: Raw(c), wslot: make(chan struct{}, 1), waiting: map[uint64]answerFunc{}, dead: make(chan struct{})}
	if sc, ok := c.(syscall.Conn); ok {
		p.rc, _ = sc.SyscallConn()
	}
	go p.answers(addr)
	return p, nil
}

// live is the open stream to addr, or nil when there is none (a send
// that must dial first takes the slow path).
func (s *Streams) live(addr string) *peerStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.peers[addr]; p != nil && !p.isDead() {
		return p
	}
	return nil
}

// answers reads the peer's answers until the stream ends, and hands each
// to its delivery's answerFunc right here: a waiting function's sidecar
// answers it from this goroutine, with no hand-off to another. A panic
// (the peer's bytes, or a delivery's answerFunc) ends the stream, not
// the sidecar.
func (p *peerStream) answers(addr string) {
	var err error
	defer func() {
		if v := recover(); v != nil {
			recovered("answers", fmt.Sprintf("the answers of %s's message stream", addr), v)
			err = fmt.Errorf("panic: %v", v)
		}
		p.end(addr, err)
	}()
	r := bufio.NewReader(p.raw)
	var b [answerLen]byte
	for {
		if _, err = io.ReadFull(r, b[:]); err != nil {
			return
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
}

// end marks the stream dead and fails the deliveries still waiting.
func (p *peerStream) end(addr string, err error) {
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

// broken drops the stream: answers() sees it and closes dead; from now
// on the stream counts as dead, so the next delivery dials a new one
// rather than write into this one before its reader has noticed.
func (p *peerStream) broken() {
	p.cut.Store(true)
	p.conn.Close()
}

// send writes one message (body: data, or size bytes of file from its
// start) and registers fn for its answer. fn is called once, from the
// stream's reader, unless send returns an error or forget(id) returns
// true.
//
// A send waits for the stream's write slot, and for room in its socket,
// until ctx ends: a receiver that stops reading (its member's inbox is
// full) holds its senders back through TCP's flow control. One that
// gives up before writing a byte leaves the stream whole (an error
// wrapping ctx's cause; the receiver never saw the message). One whose
// frame is cut (written in part when ctx ended) breaks the stream: a
// frame cannot be taken back. The deliveries waiting on it then fail
// with ErrUnreachable, and are tried again on a new stream (the receiver
// drops a message it had, by its sender's number).
func (p *peerStream) send(ctx context.Context, auth string, m *Message, file *os.File, fn answerFunc) (uint64, error) {
	p.mu.Lock()
	if p.isDead() {
		p.mu.Unlock()
		return 0, fmt.Errorf("%w: the stream ended", ErrUnreachable)
	}
	p.nextID++
	id := p.nextID
	p.waiting[id] = fn
	p.mu.Unlock()
	w := wire{auth: auth, session: m.Session, group: m.Group, from: m.From, to: m.To, tag: m.Tag, seq: m.Seq, id: id, size: m.Size}
	if file == nil {
		w.size = uint64(len(m.Data))
	}
	var n int64
	err := p.lockWrite(ctx)
	if err == nil {
		n, err = p.writeMessage(ctx, &w, m.Data, file)
		p.unlockWrite()
	}
	if err == nil {
		return id, nil
	}
	clean := n == 0 && ctx.Err() != nil // gave up before the frame's first byte
	forgot := p.forget(id)
	if !clean {
		p.broken()
	}
	if !forgot {
		return id, nil // the reader took it first: fn gets ErrUnreachable from there
	}
	if clean {
		return 0, fmt.Errorf("the stream to the receiver's sidecar was full until the send's end: %w", context.Cause(ctx))
	}
	return 0, fmt.Errorf("%w: %v", ErrUnreachable, err)
}

// lockWrite takes the write slot, waiting until ctx ends or the stream
// does.
func (p *peerStream) lockWrite(ctx context.Context) error {
	select {
	case p.wslot <- struct{}{}:
		return nil
	default:
	}
	select {
	case p.wslot <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-p.dead:
		return fmt.Errorf("%w: the stream ended", ErrUnreachable)
	}
}

func (p *peerStream) unlockWrite() { <-p.wslot }

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
// start) and waits for the receiver's answer, until ctx ends.
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
	id, err := p.send(ctx, auth, &m, file, func(st Status, err error) { ch <- answer{st, err} })
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

// Close ends every stream, and the dials under way (their deliveries
// fail with ErrUnreachable). Later deliveries dial again.
func (s *Streams) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop != nil {
		s.stop()
		s.base, s.stop = nil, nil
	}
	clear(s.dials) // their goroutines end by themselves
	for a, p := range s.peers {
		p.conn.Close()
		delete(s.peers, a)
	}
}
