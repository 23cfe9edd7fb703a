package pull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"capnproto.org/go/capnp/v3/rpc"

	dp "github.com/ziptrail/ziptrail/internal/dataplane/capnp"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
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
)

// Client pulls objects from producers; it keeps one connection per producer.
type Client struct {
	Keys      *ref.Keyring
	ChunkSize int // default 256 KiB (measured fastest here)
	Window    int // reads in flight per object; default 32
	Now       func() time.Time
	// Fallback is read when the producer is gone: Redis, then S3 (objects
	// spilled, or backed up when the producer pod terminated).
	Fallback Fallback

	mu    sync.Mutex
	conns map[string]*producerConn
}

// producerConn is one connection and its bootstrap capability, reused by
// every pull from that producer (a new bootstrap would cost a round trip).
type producerConn struct {
	conn *rpc.Conn
	prod dp.Producer
}

// Info describes a pulled object.
type Info struct {
	Bucket, Key string
	Size        int64
}

// Pull fetches a referenced object into memory.
func (c *Client) Pull(ctx context.Context, r string) ([]byte, Info, error) {
	var buf []byte
	info, err := c.PullTo(ctx, r, func(size int64) (io.WriterAt, error) {
		buf = make([]byte, size)
		return sliceWriter(buf), nil
	})
	return buf, info, err
}

// PullTo fetches a referenced object into the destination that dst returns
// for its size (e.g. a shared-memory file), chunk by chunk. When the
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
	prod, err := c.producer(ctx, rec.Addr)
	if err != nil {
		return Info{}, err
	}
	chunk, window := c.ChunkSize, c.Window
	if chunk <= 0 {
		chunk = 256 << 10
	}
	if window <= 0 {
		window = 32
	}
	fut, release := prod.Open(ctx, func(p dp.Producer_open_Params) error {
		p.SetPrefetch(uint32(chunk))
		return p.SetRef(r)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return Info{}, c.classify(rec.Addr, err)
	}
	bucket, _ := res.Bucket()
	key, _ := res.Key()
	info := Info{Bucket: bucket, Key: key, Size: int64(res.Size())}
	w, err := dst(info.Size)
	if err != nil {
		return info, err
	}
	head, err := res.Head()
	if err != nil {
		return info, err
	}
	if len(head) > 0 {
		if _, err := w.WriteAt(head, 0); err != nil {
			return info, err
		}
	}
	if int64(len(head)) == info.Size {
		return info, nil
	}
	rd := res.Reader()
	// Keep `window` reads in flight; collect them in order.
	type pending struct {
		off int64
		fut dp.Reader_read_Results_Future
		rel func()
	}
	var inflight []pending
	next := int64(len(head))
	issue := func() {
		off := next
		n := min(int64(chunk), info.Size-off)
		f, rel := rd.Read(ctx, func(p dp.Reader_read_Params) error {
			p.SetOffset(uint64(off))
			p.SetLength(uint32(n))
			return nil
		})
		inflight = append(inflight, pending{off, f, rel})
		next += n
	}
	defer func() {
		for _, p := range inflight {
			p.rel()
		}
	}()
	for next < info.Size && len(inflight) < window {
		issue()
	}
	for len(inflight) > 0 {
		p := inflight[0]
		inflight = inflight[1:]
		out, err := p.fut.Struct()
		if err != nil {
			p.rel()
			return info, c.classify(rec.Addr, err)
		}
		data, err := out.Data()
		if err == nil {
			_, err = w.WriteAt(data, p.off)
		}
		p.rel()
		if err != nil {
			return info, err
		}
		if next < info.Size {
			issue()
		}
	}
	return info, nil
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
	prod, err := c.producer(ctx, rec.Addr)
	if err != nil {
		return false, err
	}
	fut, release := prod.Extend(ctx, func(p dp.Producer_extend_Params) error {
		p.SetUntilUnixMs(until.UnixMilli())
		return p.SetRef(r)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return false, c.classify(rec.Addr, err)
	}
	return res.Ok(), nil
}

func (c *Client) producer(ctx context.Context, addr string) (dp.Producer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns == nil {
		c.conns = map[string]*producerConn{}
	}
	if pc, ok := c.conns[addr]; ok {
		select {
		case <-pc.conn.Done():
			pc.prod.Release()
			delete(c.conns, addr)
		default:
			return pc.prod, nil
		}
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return dp.Producer{}, fmt.Errorf("%w: %v", ErrProducerGone, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	pc := &producerConn{conn: conn, prod: dp.Producer(conn.Bootstrap(context.WithoutCancel(ctx)))}
	c.conns[addr] = pc
	return pc.prod, nil
}

// classify maps a remote failure to the SDK's error classes: the
// producer's store errors travel as exception text.
func (c *Client) classify(addr string, err error) error {
	msg := err.Error()
	for _, known := range []error{ErrExtendTooFar, store.ErrExhausted, store.ErrExpired, store.ErrNotFound, ref.ErrTampered, ref.ErrExpired, ref.ErrForeign, ref.ErrUnknownKey, ref.ErrMalformed} {
		if strings.Contains(msg, known.Error()) {
			return fmt.Errorf("%w (producer %s)", known, addr)
		}
	}
	c.mu.Lock()
	if pc, ok := c.conns[addr]; ok {
		select {
		case <-pc.conn.Done():
			pc.prod.Release()
			delete(c.conns, addr)
		default:
		}
	}
	c.mu.Unlock()
	return fmt.Errorf("%w: %s: %v", ErrProducerGone, addr, err)
}

// Close drops every connection.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, pc := range c.conns {
		pc.prod.Release()
		_ = pc.conn.Close()
		delete(c.conns, a)
	}
}

type sliceWriter []byte

func (s sliceWriter) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(s)) {
		return 0, fmt.Errorf("chunk at %d+%d beyond the %d-byte object", off, len(p), len(s))
	}
	return copy(s[off:], p), nil
}
