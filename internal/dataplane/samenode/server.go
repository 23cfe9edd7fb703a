package samenode

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/recovery"
)

// DefaultMaxConns bounds the connections a producer serves at once.
const DefaultMaxConns = 256

// idleTimeout ends a connection that sends no request for this long.
const idleTimeout = 30 * time.Second

// Server is a producer's same-node endpoint.
type Server struct {
	Store *store.Store
	// Keys opens references (nil until the operator sent them: every
	// request is then refused).
	Keys func() *ref.Keyring
	// Addr and Pod: this producer's data-plane address and pod UID; a
	// reference naming another producer is refused.
	Addr, Pod string
	// AllowUID decides which peers may connect (SO_PEERCRED); default:
	// this process's effective uid only.
	AllowUID func(uid uint32) bool
	// MaxConns bounds concurrent connections (default DefaultMaxConns).
	MaxConns int
	Now      func() time.Time
	// Log receives refused peers and requests; nil discards them.
	Log func(error)

	mu     sync.Mutex
	cache  map[string]*os.File // object id -> sealed memfd
	conns  map[*net.UnixConn]struct{}
	ln     *net.UnixListener
	closed bool
	slots  chan struct{}
}

// Listen creates the producer's socket, <dir>/<Pod>.sock, mode 0600 (a
// stale file of this pod's earlier run is replaced).
func (s *Server) Listen(dir string) (*net.UnixListener, error) {
	path, err := SocketPath(dir, s.Pod)
	if err != nil {
		return nil, err
	}
	_ = os.Remove(path)
	// The umask keeps the socket private from the moment it exists.
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("samenode: listen %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = ln.Close()
		return nil, net.ErrClosed
	}
	s.ln = ln
	return ln, nil
}

// Serve accepts consumers on ln until Close.
func (s *Server) Serve(ln *net.UnixListener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.ln = ln
	if s.slots == nil {
		n := s.MaxConns
		if n <= 0 {
			n = DefaultMaxConns
		}
		s.slots = make(chan struct{}, n)
	}
	s.mu.Unlock()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		select {
		case s.slots <- struct{}{}:
		default:
			served.WithLabelValues("busy").Inc()
			_ = c.Close()
			continue
		}
		if !s.track(c, true) {
			<-s.slots
			_ = c.Close()
			return nil
		}
		go func() {
			defer recovery.Recover("queue-proxy-zl", "same-node conn")
			defer func() { <-s.slots }()
			defer s.track(c, false)
			defer c.Close()
			s.serveConn(c)
		}()
	}
}

func (s *Server) track(c *net.UnixConn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		if s.closed {
			return false
		}
		if s.conns == nil {
			s.conns = map[*net.UnixConn]struct{}{}
		}
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
	return true
}

// Close stops accepting, ends the connections, removes the socket file
// and closes the cached memfds (consumers keep their own descriptors).
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var err error
	if s.ln != nil {
		err = s.ln.Close() // removes the socket file (unlink on close)
	}
	for c := range s.conns {
		_ = c.Close()
	}
	for id, f := range s.cache {
		_ = f.Close()
		delete(s.cache, id)
	}
	cachedObjects.Set(0)
	return err
}

func (s *Server) log(err error) {
	if s.Log != nil {
		s.Log(err)
	}
}

func (s *Server) allowed(uid uint32) bool {
	if s.AllowUID != nil {
		return s.AllowUID(uid)
	}
	return uid == uint32(os.Geteuid())
}

func (s *Server) serveConn(c *net.UnixConn) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		served.WithLabelValues("bad_peer").Inc()
		return
	}
	if !s.allowed(cred.Uid) {
		served.WithLabelValues("bad_peer").Inc()
		s.log(fmt.Errorf("samenode: refused peer pid %d uid %d", cred.Pid, cred.Uid))
		return
	}
	buf := make([]byte, MaxRequestBytes+1)
	oob := make([]byte, unix.CmsgSpace(16*4))
	for {
		_ = c.SetReadDeadline(time.Now().Add(idleTimeout))
		n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			// A consumer has nothing to hand the producer: close what it
			// sent (the kernel installed the descriptors in this process)
			// and drop the connection.
			closeRights(oob[:oobn])
			served.WithLabelValues("bad_request").Inc()
			s.reply(c, response{status: statusBad, msg: "file descriptors are not accepted"}, nil)
			return
		}
		if err != nil || n == 0 {
			return // EOF, idle, or closed
		}
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n > MaxRequestBytes {
			served.WithLabelValues("bad_request").Inc()
			s.reply(c, response{status: statusBad, msg: fmt.Sprintf("request larger than %d bytes", MaxRequestBytes)}, nil)
			return
		}
		req := buf[:n]
		if n < len(magic) || string(req[:len(magic)]) != string(magic[:]) {
			served.WithLabelValues("bad_request").Inc()
			s.reply(c, response{status: statusBad, msg: "not a samenode request"}, nil)
			return
		}
		if !s.handle(c, string(req[len(magic):])) {
			return
		}
	}
}

// closeRights closes every descriptor in SCM_RIGHTS messages.
func closeRights(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
}

// handle answers one request; false ends the connection.
func (s *Server) handle(c *net.UnixConn, r string) bool {
	rec, err := s.open(r)
	if err != nil {
		served.WithLabelValues("refused").Inc()
		return s.reply(c, response{status: statusRefused, msg: err.Error()}, nil)
	}
	lease, err := s.Store.Read(rec.Key)
	if err != nil {
		s.dropIfGone(rec.Key)
		served.WithLabelValues("not_found").Inc()
		return s.reply(c, response{status: statusNotFound, msg: err.Error()}, nil)
	}
	defer lease.Release()
	f, err := s.memfd(lease)
	if err == nil {
		defer f.Close()
	}
	if err != nil {
		served.WithLabelValues("internal").Inc()
		s.log(err)
		return s.reply(c, response{status: statusInternal, msg: err.Error()}, nil)
	}
	ok := s.reply(c, response{status: statusOK, size: int64(len(lease.Data)), bucket: lease.Meta.Bucket, key: lease.Meta.Key}, f)
	if ok {
		served.WithLabelValues("ok").Inc()
		servedBytes.Add(float64(len(lease.Data)))
	}
	lease.Release()
	s.dropIfGone(rec.Key)
	return ok
}

// open verifies a reference as pull.Server does (key, namespace, expiry,
// a keep-alive past the sealed expiry) and that it names this producer.
func (s *Server) open(r string) (ref.Record, error) {
	var kr *ref.Keyring
	if s.Keys != nil {
		kr = s.Keys()
	}
	if kr == nil {
		return ref.Record{}, errors.New("no reference keys yet")
	}
	now := time.Now()
	if s.Now != nil {
		now = s.Now()
	}
	rec, err := kr.Open(r, now)
	if errors.Is(err, ref.ErrExpired) {
		if old, oerr := kr.OpenExpired(r); oerr == nil && s.Store.ExtendedPast(old.Key, old.Expires, now) {
			rec, err = old, nil
		}
	}
	if err != nil {
		return ref.Record{}, err
	}
	if rec.Pod != s.Pod || rec.Addr != s.Addr {
		return ref.Record{}, errors.New("reference names another producer")
	}
	return rec, nil
}

// reply sends one response, with f's descriptor attached if not nil.
func (s *Server) reply(c *net.UnixConn, r response, f *os.File) bool {
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	_ = c.SetWriteDeadline(time.Now().Add(idleTimeout))
	_, _, err := c.WriteMsgUnix(r.encode(), oob, nil)
	return err == nil && r.status != statusBad
}

// memfd is a duplicate of the object's sealed memfd (the caller closes
// it; the cache may close its own meanwhile), made with one copy on the
// object's first read.
func (s *Server) memfd(l *store.Lease) (*os.File, error) {
	s.mu.Lock()
	f, ok := s.cache[l.Meta.ID]
	s.mu.Unlock()
	if !ok {
		// The copy runs unlocked: other objects' reads do not wait for it.
		nf, err := newSealedMemfd(l.Meta.ID, l.Data)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = nf.Close()
			return nil, net.ErrClosed
		}
		if f, ok = s.cache[l.Meta.ID]; ok {
			_ = nf.Close() // another read made it meanwhile
		} else {
			f = nf
			s.cacheLocked(l.Meta.ID, f)
		}
	} else {
		s.mu.Lock()
		if s.cache[l.Meta.ID] != f {
			// Dropped meanwhile (the store let it go): nothing to serve.
			s.mu.Unlock()
			return nil, fmt.Errorf("samenode: %s: %w", l.Meta.ID, store.ErrNotFound)
		}
	}
	defer s.mu.Unlock()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("samenode: dup memfd: %w", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

func (s *Server) cacheLocked(id string, f *os.File) {
	if s.closed {
		_ = f.Close() // Prepare or Adopt after Close: nothing serves it
		return
	}
	if s.cache == nil {
		s.cache = map[string]*os.File{}
	}
	s.cache[id] = f
	cachedObjects.Set(float64(len(s.cache)))
}

// Prepare copies a stored object into its memfd now (at put) rather
// than on its first same-node read.
func (s *Server) Prepare(id string, data []byte) error {
	f, err := newSealedMemfd(id, data)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.cache[id]; ok {
		_ = old.Close()
	}
	s.cacheLocked(id, f)
	return nil
}

// Adopt takes an object that already lives in a sealed memfd (a function
// that produced its output in shared memory hands the descriptor over):
// no copy at all. f must carry RequiredSeals and be size bytes; the
// server owns it from now on (closed when the store lets the object go).
func (s *Server) Adopt(id string, f *os.File, size int64) error {
	if err := checkSealed(int(f.Fd()), size); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.cache[id]; ok {
		_ = old.Close()
	}
	s.cacheLocked(id, f)
	return nil
}

// NewSealed copies data into a new memfd sealed read-only (the one copy
// of a put that does not produce its object in shared memory).
func NewSealed(name string, data []byte) (*os.File, error) { return newSealedMemfd(name, data) }

// MapSealed maps a sealed memfd read-only (pages faulted in as read):
// the seals guarantee the mapping cannot change or shrink under its reader.
func MapSealed(f *os.File, size int64) ([]byte, error) {
	if err := checkSealed(int(f.Fd()), size); err != nil {
		return nil, err
	}
	return (&Object{File: f, Size: size}).mmap(0)
}

// Cached is the number of memfds the server holds.
func (s *Server) Cached() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.cache)
}

func (s *Server) dropIfGone(id string) {
	if _, _, ok := s.Store.Peek(id); ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.cache[id]; ok {
		_ = f.Close()
		delete(s.cache, id)
		cachedObjects.Set(float64(len(s.cache)))
	}
}

// Sweep closes the memfds of objects the store no longer holds (freed,
// expired, spilled, collected); the sidecar runs it with the store's.
func (s *Server) Sweep() {
	s.mu.Lock()
	ids := make([]string, 0, len(s.cache))
	for id := range s.cache {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.dropIfGone(id)
	}
}
