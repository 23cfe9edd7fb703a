// Package pull moves objects between sidecars over Cap'n Proto RPC: the
// producer's Server hands out readers for sealed references, the consumer's
// Client pulls objects in chunks with a window of reads in flight, straight
// into the destination (a buffer or a shared-memory file), so a large
// object never sits twice in the consumer's memory.
package pull

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"capnproto.org/go/capnp/v3/rpc"

	dp "github.com/ziptrail/ziptrail/internal/dataplane/capnp"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// Fallback reads objects from storage tiers (tier.Chain implements it).
type Fallback interface {
	Get(ctx context.Context, id string) ([]byte, string, error)
}

// MaxChunk bounds one read (Cap'n Proto caps a message at 64 MiB).
const MaxChunk = 8 << 20

// DefaultMaxExtend bounds how far ahead of now one extend may push an
// object's expiry (the sidecar's default object TTL). A keep-alive extends
// again before that passes; the reference's own expiry, which no extend
// moves, ends the object's life at the latest that much later.
const DefaultMaxExtend = 10 * time.Minute

// Server serves the producer side.
type Server struct {
	Store *store.Store
	Keys  *ref.Keyring
	Now   func() time.Time
	// Fallback serves objects no longer in memory (spilled to the fast tier).
	Fallback Fallback
	// OpenRef, when set, opens references instead of Keys: a server holding
	// objects of several namespaces (the operator's session inputs).
	OpenRef func(r string, now time.Time) (ref.Record, error)
	// MaxExtend bounds an extend's expiry ahead of now (default
	// DefaultMaxExtend); a later one is refused with ErrExtendTooFar.
	MaxExtend time.Duration
	// Streams serves a connection that starts with StreamMagic (the
	// four bytes it consumed): another sidecar's message stream
	// (docs/messaging.md), on the same port as pulls. Nil closes such
	// connections.
	Streams func(net.Conn)
	// StreamMagic is what tells a message stream from Cap'n Proto (whose
	// first word, a segment count, is never it).
	StreamMagic [4]byte

	mu      sync.Mutex
	conns   map[*rpc.Conn]struct{}
	streams map[net.Conn]struct{}
	ln      net.Listener
}

// Serve accepts consumer connections until the listener closes.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.ln = ln
	if s.conns == nil {
		s.conns = map[*rpc.Conn]struct{}{}
	}
	s.mu.Unlock()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		go s.serveConn(nc)
	}
}

// serveConn tells a message stream from a Cap'n Proto connection by its
// first four bytes, then serves it.
func (s *Server) serveConn(nc net.Conn) {
	var first [4]byte
	if _, err := io.ReadFull(nc, first[:]); err != nil {
		nc.Close()
		return
	}
	if s.Streams != nil && first == s.StreamMagic {
		s.mu.Lock()
		if s.streams == nil {
			s.streams = map[net.Conn]struct{}{}
		}
		s.streams[nc] = struct{}{}
		s.mu.Unlock()
		s.Streams(nc)
		s.mu.Lock()
		delete(s.streams, nc)
		s.mu.Unlock()
		return
	}
	conn := s.newConn(prefixed{Conn: nc, r: io.MultiReader(bytes.NewReader(first[:]), nc)})
	s.mu.Lock()
	if s.conns == nil {
		s.conns = map[*rpc.Conn]struct{}{}
	}
	s.conns[conn] = struct{}{}
	s.mu.Unlock()
	<-conn.Done()
	s.mu.Lock()
	delete(s.conns, conn)
	s.mu.Unlock()
}

// prefixed replays bytes already read before the connection's own.
type prefixed struct {
	net.Conn
	r io.Reader
}

func (p prefixed) Read(b []byte) (int, error) { return p.r.Read(b) }

// Close stops accepting and drops every connection.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.ln != nil {
		err = s.ln.Close()
	}
	for c := range s.conns {
		_ = c.Close()
	}
	for c := range s.streams {
		_ = c.Close()
	}
	return err
}

func (s *Server) open(r string) (ref.Record, error) {
	if s.OpenRef != nil {
		return s.OpenRef(r, s.now())
	}
	now := s.now()
	rec, err := s.Keys.Open(r, now)
	if errors.Is(err, ref.ErrExpired) && s.Store != nil {
		// Past its sealed expiry, a reference still reaches an object a
		// keep-alive extended (activator-ext during a cold start): the
		// store's expiry is the object's, the sealed one its TTL at birth.
		if old, oerr := s.Keys.OpenExpired(r); oerr == nil && s.Store.ExtendedPast(old.Key, old.Expires, now) {
			return old, nil
		}
	}
	return rec, err
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Server) maxExtend() time.Duration {
	if s.MaxExtend > 0 {
		return s.MaxExtend
	}
	return DefaultMaxExtend
}

type producer struct{ s *Server }

func (p *producer) Open(_ context.Context, call dp.Producer_open) error {
	r, err := call.Args().Ref()
	if err != nil {
		return err
	}
	rec, err := p.s.open(r)
	if err != nil {
		return err
	}
	lease, err := p.s.Store.Read(rec.Key)
	if errors.Is(err, store.ErrNotFound) && p.s.Fallback != nil {
		// Spilled under memory pressure: serve it from the tier.
		data, _, ferr := p.s.Fallback.Get(context.Background(), rec.Key)
		if ferr != nil {
			return fmt.Errorf("%w (and %v)", err, ferr)
		}
		lease = store.Detached(store.Meta{ID: rec.Key, Size: int64(len(data))}, data)
	} else if err != nil {
		return err
	}
	res, err := call.AllocResults()
	if err != nil {
		lease.Release()
		return err
	}
	res.SetSize(uint64(len(lease.Data)))
	_ = res.SetBucket(lease.Meta.Bucket)
	_ = res.SetKey(lease.Meta.Key)
	head := min(int(call.Args().Prefetch()), len(lease.Data), MaxChunk)
	if err := res.SetHead(lease.Data[:head]); err != nil {
		lease.Release()
		return err
	}
	servedBytes.Add(float64(head))
	if head == len(lease.Data) {
		// Everything travelled in the head: no reader needed.
		lease.Release()
		return nil
	}
	return res.SetReader(dp.Reader_ServerToClient(&reader{lease: lease}))
}

func (p *producer) Extend(_ context.Context, call dp.Producer_extend) error {
	r, err := call.Args().Ref()
	if err != nil {
		return err
	}
	rec, err := p.s.open(r)
	if err != nil {
		return err
	}
	until, now, limit := time.UnixMilli(call.Args().UntilUnixMs()), p.s.now(), p.s.maxExtend()
	if until.After(now.Add(limit)) {
		// An object held without bound is pod memory lost: refuse
		// rather than shorten silently, so the caller knows.
		return fmt.Errorf("%w: asked to keep the object %v from now, at most %v; extend again later instead",
			ErrExtendTooFar, until.Sub(now).Round(time.Second), limit)
	}
	ok := p.s.Store.Extend(rec.Key, until)
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetOk(ok)
	return nil
}

// reader is one read of an object; releasing the capability ends the lease.
type reader struct{ lease *store.Lease }

func (r *reader) Read(_ context.Context, call dp.Reader_read) error {
	off, n := call.Args().Offset(), uint64(call.Args().Length())
	data := r.lease.Data
	if n > MaxChunk {
		return fmt.Errorf("chunk of %d bytes exceeds the %d limit", n, MaxChunk)
	}
	if off > uint64(len(data)) {
		return fmt.Errorf("offset %d beyond the object's %d bytes", off, len(data))
	}
	end := min(off+n, uint64(len(data)))
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	servedBytes.Add(float64(end - off))
	return res.SetData(data[off:end])
}

// Shutdown runs when the consumer releases the reader (or disconnects).
func (r *reader) Shutdown() { r.lease.Release() }
