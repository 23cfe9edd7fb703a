package pull

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/dataplane/streamio"
)

// Errors of a pull, beyond the reference errors of package ref.
var (
	ErrProducerGone = errors.New("producer unreachable or gone mid-transfer")
	ErrNotFound     = store.ErrNotFound
	ErrExhausted    = store.ErrExhausted
	ErrExpired      = store.ErrExpired
	// ErrExtendTooFar: an extend asked for more than the producer's
	// Server.MaxExtend ahead of now.
	ErrExtendTooFar = errors.New("extend beyond the producer's limit")
	// ErrRefused: the producer refused a request for another reason
	// (its message says which).
	ErrRefused = errors.New("producer refused the request")
)

// codeErrors are the error classes a response carries, by code (0: ok).
// The order is the wire format's: append only.
var codeErrors = []error{nil, ErrExtendTooFar, store.ErrExhausted, store.ErrExpired, store.ErrNotFound,
	ref.ErrTampered, ref.ErrExpired, ref.ErrForeign, ref.ErrUnknownKey, ref.ErrMalformed, errFrame, ErrRefused}

const codeOK = 0

// codeError is a response code's error class; a code added after this
// side was built (a newer producer, during a rolling upgrade) is
// ErrRefused, whose message the producer's text completes.
func codeError(code uint8) error {
	if int(code) < len(codeErrors) {
		return codeErrors[code]
	}
	return ErrRefused
}

// errResponse is the answer that tells the consumer err's class.
func errResponse(err error) response {
	if err == nil {
		return response{}
	}
	code := len(codeErrors) - 1
	for i, e := range codeErrors[1:] {
		if errors.Is(err, e) {
			code = i + 1
			break
		}
	}
	return response{code: uint8(code), msg: err.Error()}
}

// maxIdlePerPeer bounds the idle connections kept per producer; one idle
// for longer than maxIdleAge is closed (producers come and go: a pod's
// address must not keep a dead connection open forever).
const (
	maxIdlePerPeer = 16
	maxIdleAge     = 90 * time.Second // below the producer's IdleTimeout
)

// Client pulls objects from producers over persistent connections (one
// request at a time each; a free one is reused, so a pull pays no dial).
type Client struct {
	Keys *ref.Keyring
	Now  func() time.Time
	// Fallback is read when the producer is gone: Redis, then S3 (objects
	// spilled, or backed up when the producer pod terminated).
	Fallback Fallback
	// Timeouts bound a pull's connect, the wait for its answer and the
	// body's pauses (zero fields: the defaults).
	Timeouts Timeouts

	mu     sync.Mutex
	idle   map[string][]*peerConn
	swept  time.Time
	closed bool
}

type peerConn struct {
	addr  string
	nc    *deadlineConn
	br    *bufio.Reader
	since time.Time // idle since
}

// Info describes a pulled object.
type Info struct {
	Bucket, Key string
	Size        int64
}

// Buffer is a destination in memory: a pull reads the object's bytes
// straight into it.
type Buffer []byte

// WriteAt copies p to off (for destinations written piece by piece).
func (b Buffer) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(b)) {
		return 0, fmt.Errorf("chunk at %d+%d beyond the %d-byte object", off, len(p), len(b))
	}
	return copy(b[off:], p), nil
}

// Mapping is a destination the consumer made and mapped itself: a file
// (e.g. a shared-memory file it keeps and reuses) already sized for the
// object, Mem its shared writable mapping of at least the object's size.
// The body reaches the file through the kernel only — the bytes the
// stream had buffered with pwrite, the rest received straight into Mem —
// so a file truncated underneath (by whoever else can open it) fails the
// pull with EFAULT instead of faulting the consumer's process, and no
// page is faulted in when Mem was populated beforehand.
type Mapping struct {
	File *os.File
	Mem  []byte
}

// WriteAt writes through the file (for a fallback read from the tiers).
func (m *Mapping) WriteAt(p []byte, off int64) (int, error) { return m.File.WriteAt(p, off) }

// Pull fetches a referenced object into memory.
func (c *Client) Pull(ctx context.Context, r string) ([]byte, Info, error) {
	var buf Buffer
	info, err := c.PullTo(ctx, r, func(size int64) (io.WriterAt, error) {
		buf = make(Buffer, size)
		return buf, nil
	})
	return buf, info, err
}

// PullTo fetches a referenced object into the destination that dst returns
// for its size: a Buffer or an *os.File (e.g. in shared memory) get the
// bytes straight from the socket, anything else piece by piece. When the
// producer is gone it reads the object from the storage tiers instead.
func (c *Client) PullTo(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (Info, error) {
	info, err := c.pullTo(ctx, r, dst)
	observePull(info, err)
	return info, err
}

func (c *Client) pullTo(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (Info, error) {
	info, err := c.pullFromProducer(ctx, r, dst)
	if err == nil || !errors.Is(err, ErrProducerGone) || c.Fallback == nil {
		return info, err
	}
	rec, rerr := c.Keys.Open(r, time.Now())
	if rerr != nil {
		return info, err
	}
	fallbacks.WithLabelValues(goneReason(err)).Inc()
	data, from, ferr := c.Fallback.Get(ctx, rec.Key)
	if ferr != nil {
		return info, fmt.Errorf("%w; no tier has it either: %v", err, ferr)
	}
	w, werr := dst(int64(len(data)))
	if werr != nil {
		return info, werr
	}
	if _, werr := w.WriteAt(data, 0); werr != nil {
		return info, werr
	}
	fallbackReads.WithLabelValues(from).Inc()
	return Info{Size: int64(len(data))}, nil
}

func (c *Client) pullFromProducer(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (Info, error) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	rec, err := c.openForProducer(r, now())
	if err != nil {
		return Info{}, err
	}
	var info Info
	_, err = c.roundTrip(ctx, rec.Addr, request{op: opPull, ref: r}, func(pc *peerConn, p response) error {
		info = Info{Bucket: p.bucket, Key: p.key, Size: int64(p.size)}
		w, err := dst(info.Size)
		if err != nil {
			return &dstError{err}
		}
		return readBody(pc, w, info.Size)
	})
	return info, err
}

// dstError: the destination failed (not the producer).
type dstError struct{ err error }

func (e *dstError) Error() string { return e.err.Error() }
func (e *dstError) Unwrap() error { return e.err }

// readBody reads size bytes from the stream into w.
func readBody(pc *peerConn, w io.WriterAt, size int64) error {
	switch d := w.(type) {
	case Buffer:
		if int64(len(d)) < size {
			return &dstError{fmt.Errorf("buffer of %d bytes for a %d-byte object", len(d), size)}
		}
		return streamio.ReadFull(pc.br, pc.nc, d[:size])
	case *Mapping:
		if int64(len(d.Mem)) < size {
			return &dstError{fmt.Errorf("mapping of %d bytes for a %d-byte object", len(d.Mem), size)}
		}
		n := int(min(int64(pc.br.Buffered()), size))
		if n > 0 {
			head, _ := pc.br.Peek(n)
			if _, err := d.File.WriteAt(head, 0); err != nil {
				return &dstError{err}
			}
			_, _ = pc.br.Discard(n)
		}
		if _, err := io.ReadFull(pc.nc, d.Mem[n:size]); err != nil {
			if errors.Is(err, syscall.EFAULT) {
				return &dstError{fmt.Errorf("the destination file shrank under the pull: %w", err)}
			}
			return err
		}
		return nil
	case *os.File:
		err := streamio.ReadIntoFile(pc.br, pc.nc, d, size)
		if errors.Is(err, errors.ErrUnsupported) {
			break // not mappable here: piece by piece
		}
		if errors.Is(err, streamio.ErrNoRoom) {
			return &dstError{err}
		}
		return err
	}
	buf := make([]byte, min(size, 256<<10))
	for off := int64(0); off < size; {
		n := min(int64(len(buf)), size-off)
		if _, err := io.ReadFull(pc.br, buf[:n]); err != nil {
			return err
		}
		if _, err := w.WriteAt(buf[:n], off); err != nil {
			return &dstError{err}
		}
		off += n
	}
	return nil
}

// openForProducer opens a reference to ask its producer: one past its
// sealed expiry is still sent, since a keep-alive may have extended the
// object and only the producer knows (it refuses the reference otherwise,
// with the expiry error).
func (c *Client) openForProducer(r string, now time.Time) (ref.Record, error) {
	rec, err := c.Keys.Open(r, now)
	if errors.Is(err, ref.ErrExpired) {
		if old, oerr := c.Keys.OpenExpired(r); oerr == nil {
			return old, nil
		}
	}
	return rec, err
}

// Extend asks the producer to keep a referenced object until `until`.
func (c *Client) Extend(ctx context.Context, r string, until time.Time) (bool, error) {
	rec, err := c.openForProducer(r, time.Now())
	if err != nil {
		return false, err
	}
	p, err := c.roundTrip(ctx, rec.Addr, request{op: opExtend, until: until.UnixMilli(), ref: r}, nil)
	return p.ok, err
}

// roundTrip sends q on a connection to addr and reads the answer's header;
// body reads an ok answer's body. A connection taken from the pool that
// turns out closed (the producer's idle timeout) before any answer came
// is replaced once, by a new one: the pool's other connections to addr
// are dropped with it, since the same timeout closed them too (retrying
// on the next pooled one failed the same way, and a live producer's
// object was taken for lost).
func (c *Client) roundTrip(ctx context.Context, addr string, q request, body func(*peerConn, response) error) (response, error) {
	for attempt := 0; ; attempt++ {
		pc, reused, err := c.conn(ctx, addr)
		if err != nil {
			return response{}, err
		}
		p, answered, err := c.exchange(ctx, pc, q, body)
		if err == nil {
			return p, nil
		}
		var de *dstError
		switch {
		case answered && p.code != codeOK:
			return p, fmt.Errorf("%w (producer %s: %s)", codeError(p.code), addr, p.msg)
		case errors.As(err, &de):
			return p, de.err
		case ctx.Err() != nil:
			return p, fmt.Errorf("pull from %s: %w", addr, context.Cause(ctx))
		case timedOut(err) && !answered:
			// Not retried on a new connection: a producer silent that
			// long is not one that closed an idle connection.
			return p, &goneError{reasonResponseTimeout, addr, fmt.Errorf("no answer within %v", c.Timeouts.response())}
		case timedOut(err):
			return p, &goneError{reasonBodyStall, addr, fmt.Errorf("no byte of the %d-byte body for %v", p.size, c.Timeouts.stall())}
		case reused && !answered && attempt == 0:
			c.dropIdle(addr)
			continue
		}
		return p, &goneError{reasonConnectionLost, addr, err}
	}
}

// exchange runs one request on pc, returning pc to the pool if the
// stream is still in step afterwards; answered says a header came back.
func (c *Client) exchange(ctx context.Context, pc *peerConn, q request, body func(*peerConn, response) error) (p response, answered bool, err error) {
	pc.nc.expectAnswer(c.Timeouts.response())
	stop := context.AfterFunc(ctx, pc.nc.interrupt)
	inStep := false
	defer func() {
		if stop() && inStep {
			c.put(pc)
		} else {
			pc.nc.Close()
		}
	}()
	if _, err = pc.nc.Write(q.encode()); err != nil {
		return p, false, err
	}
	if p, err = readResponse(pc.br); err != nil {
		return p, false, err
	}
	if p.code != codeOK {
		inStep = true
		return p, true, errors.New(p.msg)
	}
	if body == nil && p.size != 0 {
		// A body nobody reads would put the stream out of step.
		return p, true, fmt.Errorf("%w: a %d-byte body in the answer to op %d", errFrame, p.size, q.op)
	}
	if body != nil {
		pc.nc.expectBody(c.Timeouts.stall())
		if err = body(pc, p); err != nil {
			return p, true, err
		}
	}
	inStep = true
	return p, true, nil
}

// conn returns an idle connection to addr, or a new one.
func (c *Client) conn(ctx context.Context, addr string) (*peerConn, bool, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, false, &goneError{reasonClientClosed, addr, errors.New("client closed")}
	}
	if l := c.idle[addr]; len(l) > 0 {
		pc := l[len(l)-1]
		c.idle[addr] = l[:len(l)-1]
		if len(l) == 1 {
			delete(c.idle, addr)
		}
		c.mu.Unlock()
		return pc, true, nil
	}
	c.mu.Unlock()
	// A lost node's address drops the SYNs without a reset: without
	// a bound, the connect would last as long as the caller's context.
	d := net.Dialer{Timeout: c.Timeouts.dial()}
	raw, err := d.DialContext(ctx, "tcp", addr)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, false, fmt.Errorf("pull from %s: %w", addr, context.Cause(ctx))
	case timedOut(err):
		return nil, false, &goneError{reasonDialTimeout, addr, fmt.Errorf("no connection within %v: %v", c.Timeouts.dial(), err)}
	default:
		return nil, false, &goneError{reasonDialError, addr, err}
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	// The magic fits a fresh socket's buffer: the write does not wait.
	if _, err := raw.Write(StreamMagic[:]); err != nil {
		raw.Close()
		return nil, false, &goneError{reasonConnectionLost, addr, err}
	}
	nc := &deadlineConn{Conn: raw}
	return &peerConn{addr: addr, nc: nc, br: bufio.NewReaderSize(nc, 64<<10)}, false, nil
}

func (c *Client) put(pc *peerConn) {
	pc.nc.idle()
	now := time.Now()
	pc.since = now
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.idle[pc.addr]) >= maxIdlePerPeer {
		pc.nc.Close()
		return
	}
	if c.idle == nil {
		c.idle = map[string][]*peerConn{}
	}
	c.idle[pc.addr] = append(c.idle[pc.addr], pc)
	if now.Sub(c.swept) > maxIdleAge/4 {
		c.swept = now
		c.sweepLocked(now)
	}
}

// dropIdle closes every idle connection to addr.
func (c *Client) dropIdle(addr string) {
	c.mu.Lock()
	l := c.idle[addr]
	delete(c.idle, addr)
	c.mu.Unlock()
	for _, pc := range l {
		pc.nc.Close()
	}
}

// sweepLocked closes connections idle for longer than maxIdleAge (the
// oldest are first in each list).
func (c *Client) sweepLocked(now time.Time) {
	for addr, l := range c.idle {
		n := 0
		for n < len(l) && now.Sub(l[n].since) > maxIdleAge {
			l[n].nc.Close()
			n++
		}
		switch {
		case n == len(l):
			delete(c.idle, addr)
		case n > 0:
			c.idle[addr] = append(l[:0], l[n:]...)
		}
	}
}

// Close drops every idle connection (pulls under way end on their own).
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for a, l := range c.idle {
		for _, pc := range l {
			pc.nc.Close()
		}
		delete(c.idle, a)
	}
}
