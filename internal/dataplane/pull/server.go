// Package pull moves objects between sidecars: the producer's Server
// answers pulls of sealed references on its data-plane port, the
// consumer's Client pulls objects over persistent connections, straight
// into the destination (a buffer or a shared-memory file), so a large
// object never sits twice in the consumer's memory. The wire format is in
// frame.go.
package pull

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/recovery"
)

// Fallback reads objects from storage tiers (tier.Chain implements it).
type Fallback interface {
	Get(ctx context.Context, id string) ([]byte, string, error)
}

// DefaultMaxExtend bounds how far ahead of now one extend may push an
// object's expiry (the sidecar's default object TTL). A keep-alive extends
// again before that passes; the reference's own expiry, which no extend
// moves, ends the object's life at the latest that much later.
const DefaultMaxExtend = 10 * time.Minute

// Limits of a producer's connections (Server fields override them).
const (
	// DefaultHeaderTimeout bounds a request (or a connection's magic)
	// from its first byte to its last: half a header, then silence,
	// loses the connection.
	DefaultHeaderTimeout = 10 * time.Second
	// DefaultIdleTimeout closes a connection with no request for that long.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxConns bounds the pull connections served at once; more
	// are closed at once.
	DefaultMaxConns = 4096
	// writeSlice is how much of an answer must leave within
	// WriteTimeout: a consumer that reads slower than that loses the
	// connection (and the object's lease) instead of holding it forever.
	writeSlice = 8 << 20
)

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
	// StreamMagic tells a message stream from a pull stream (which
	// starts with pull.StreamMagic).
	StreamMagic [4]byte
	// Opens answers a connection that starts with OpenMagic: another
	// sidecar asking for a direct channel across nodes (the connection
	// becomes the channel; docs/messaging.md). Nil closes such
	// connections. They count against MaxConns, as pulls do.
	Opens     func(net.Conn)
	OpenMagic [4]byte
	// HeaderTimeout, IdleTimeout and MaxConns: zero means the Default.
	HeaderTimeout, IdleTimeout time.Duration
	MaxConns                   int
	// WriteTimeout bounds sending each 8 MiB of an answer (default
	// 30 s): a consumer that stops reading loses the connection and the
	// object's lease.
	WriteTimeout time.Duration

	mu      sync.Mutex
	conns   map[net.Conn]struct{} // pull streams
	streams map[net.Conn]struct{} // message streams
	ln      net.Listener
	closed  bool
}

// Serve accepts consumer connections until the listener closes.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.ln = ln
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ln.Close()
	}
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		go s.serveConn(nc)
	}
}

// serveConn tells a message stream from a pull stream by its first four
// bytes, then serves it; anything else is closed.
func (s *Server) serveConn(nc net.Conn) {
	// Any pod may connect to the data port: a panic its bytes reach ends
	// its connection, never the sidecar.
	var stream, tracked bool
	defer func() {
		if v := recover(); v != nil {
			// Its slot first: the peer may connect again the moment it
			// sees the close.
			if tracked {
				s.untrack(stream, nc)
			}
			recovery.Report("queue-proxy-zl", "data port conn", v)
			nc.Close()
		}
	}()
	var first [4]byte
	_ = nc.SetReadDeadline(time.Now().Add(s.headerTimeout()))
	if _, err := io.ReadFull(nc, first[:]); err != nil {
		nc.Close()
		return
	}
	_ = nc.SetReadDeadline(time.Time{})
	serve, limit := s.servePulls, s.maxConns()
	switch {
	case s.Streams != nil && first == s.StreamMagic:
		stream, serve, limit = true, s.Streams, 0
	case s.Opens != nil && first == s.OpenMagic:
		serve = s.Opens
	case first == StreamMagic:
	default:
		nc.Close()
		return
	}
	if !s.track(stream, nc, limit) {
		if !stream {
			refusedConns.Inc()
		}
		nc.Close()
		return
	}
	tracked = true
	serve(nc)
	s.untrack(stream, nc)
}

// track registers a connection (false when closed, or limit reached).
func (s *Server) track(stream bool, nc net.Conn, limit int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &s.conns
	if stream {
		m = &s.streams
	}
	if s.closed || (limit > 0 && len(*m) >= limit) {
		return false
	}
	if *m == nil {
		*m = map[net.Conn]struct{}{}
	}
	(*m)[nc] = struct{}{}
	return true
}

func (s *Server) untrack(stream bool, nc net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if stream {
		delete(s.streams, nc)
	} else {
		delete(s.conns, nc)
	}
}

// servePulls answers one consumer's requests in turn until it hangs up,
// sends a malformed frame, stalls mid-request or idles too long.
func (s *Server) servePulls(nc net.Conn) {
	defer nc.Close()
	br := bufio.NewReaderSize(nc, 4<<10)
	for {
		// Wait for the next request's first byte, then bound the rest.
		_ = nc.SetReadDeadline(time.Now().Add(s.idleTimeout()))
		if _, err := br.Peek(1); err != nil {
			return
		}
		_ = nc.SetReadDeadline(time.Now().Add(s.headerTimeout()))
		q, err := readRequest(br)
		if err != nil {
			if errors.Is(err, errFrame) {
				// Say why before hanging up (best effort).
				_ = nc.SetWriteDeadline(time.Now().Add(s.headerTimeout()))
				p := errResponse(err)
				_, _ = nc.Write(p.header())
			}
			return
		}
		_ = nc.SetReadDeadline(time.Time{})
		if err := s.answer(nc, q); err != nil {
			return
		}
	}
}

// answer serves one request: the header, then (pull) the object's bytes.
func (s *Server) answer(nc net.Conn, q request) error {
	if q.op == opExtend {
		ok, err := s.extend(q.ref, time.UnixMilli(q.until))
		p := errResponse(err)
		p.ok = ok
		_ = nc.SetWriteDeadline(time.Now().Add(s.headerTimeout()))
		_, werr := nc.Write(p.header())
		return werr
	}
	lease, err := s.lease(q.ref)
	if err != nil {
		p := errResponse(err)
		_ = nc.SetWriteDeadline(time.Now().Add(s.headerTimeout()))
		_, werr := nc.Write(p.header())
		return werr
	}
	defer lease.Release()
	p := response{bucket: lease.Meta.Bucket, key: lease.Meta.Key, size: uint64(len(lease.Data))}
	// The header and the body (from the store's memory, or the mapped
	// shared-memory file the object lives in) go with writev, a slice
	// at a time: each must leave within WriteTimeout.
	bufs := net.Buffers{p.header()}
	for off := 0; ; off += writeSlice {
		body := lease.Data[off:min(off+writeSlice, len(lease.Data))]
		bufs = append(bufs, body)
		_ = nc.SetWriteDeadline(time.Now().Add(s.writeTimeout()))
		if _, err := bufs.WriteTo(nc); err != nil {
			return err
		}
		servedBytes.Add(float64(len(body)))
		if off+writeSlice >= len(lease.Data) {
			return nil
		}
		bufs = bufs[:0]
	}
}

// lease opens a reference and starts one of the object's reads.
func (s *Server) lease(r string) (*store.Lease, error) {
	rec, err := s.open(r)
	if err != nil {
		return nil, err
	}
	lease, err := s.Store.Read(rec.Key)
	if errors.Is(err, store.ErrNotFound) && s.Fallback != nil {
		// Spilled under memory pressure: serve it from the tier.
		data, _, ferr := s.Fallback.Get(context.Background(), rec.Key)
		if ferr != nil {
			return nil, fmt.Errorf("%w (and %v)", err, ferr)
		}
		return store.Detached(store.Meta{ID: rec.Key, Size: int64(len(data))}, data), nil
	}
	return lease, err
}

func (s *Server) extend(r string, until time.Time) (bool, error) {
	rec, err := s.open(r)
	if err != nil {
		return false, err
	}
	now, limit := s.now(), s.maxExtend()
	if until.After(now.Add(limit)) {
		// An object held without bound is pod memory lost: refuse
		// rather than shorten silently, so the caller knows.
		return false, fmt.Errorf("%w: asked to keep the object %v from now, at most %v; extend again later instead",
			ErrExtendTooFar, until.Sub(now).Round(time.Second), limit)
	}
	return s.Store.Extend(rec.Key, until), nil
}

// Close stops accepting and drops every connection.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
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
	s.mu.Unlock()
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

func (s *Server) headerTimeout() time.Duration {
	if s.HeaderTimeout > 0 {
		return s.HeaderTimeout
	}
	return DefaultHeaderTimeout
}

func (s *Server) idleTimeout() time.Duration {
	if s.IdleTimeout > 0 {
		return s.IdleTimeout
	}
	return DefaultIdleTimeout
}

func (s *Server) maxConns() int {
	if s.MaxConns > 0 {
		return s.MaxConns
	}
	return DefaultMaxConns
}

func (s *Server) writeTimeout() time.Duration {
	if s.WriteTimeout > 0 {
		return s.WriteTimeout
	}
	return 30 * time.Second
}
