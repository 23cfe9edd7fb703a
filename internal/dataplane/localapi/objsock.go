package localapi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/recovery"
)

// The object socket (docs/samenode.md, "Objects as descriptors"): a
// third unix socket next to the local API's, SOCK_SEQPACKET, on which
// objects travel as file descriptors (SCM_RIGHTS) instead of paths:
//
//   - put: the function hands over a sealed memfd it wrote its object
//     into (Go SDK Alloc). The sidecar maps it read-only as the object's
//     storage and, with the same-node data plane on, gives the same
//     memfd to consumers on its node (samenode.Server.Adopt): no copy
//     from the function's write to a same-node consumer's read.
//   - get: when the object is a sealed memfd here (adopted, or received
//     from a producer on this node), the sidecar passes that descriptor
//     on; the function maps it read-only. Otherwise it answers
//     "fallback" and the function uses the gRPC Get (a file).
//
// One message per request and per response:
//
//	request:  "ZTO1", u8 op, then
//	          op 1 hello:  nothing
//	          op 2 put:    u32 reads, i64 ttl ms, u64 size, u16 session
//	                       length, session; exactly one descriptor
//	          op 3 get:    the reference
//	response: "ZTO1", u8 status, then
//	          ok hello:    u8 flags (bit 0: the same-node path is on:
//	                       puts are adopted, gets of same-node objects
//	                       come as descriptors; bit 1: ops 4 and 5 are
//	                       served, objbytes.go)
//	          ok put:      the reference
//	          ok get:      u64 size, u16 source length, source; one descriptor
//	          fallback:    nothing (get: use the gRPC Get)
//	          error:       u32 gRPC code, u16 reason length, reason, message
//
// Integers are little endian. Trust: the function is treated as hostile
// here as on the gRPC socket. A put's descriptor must be a memfd carrying
// samenode.RequiredSeals (no write, shrink or grow, ever, by anyone), a
// regular file of exactly the announced size, within the store's cap, and
// not the storage of an object this sidecar already holds; anything else
// is refused with a clear error, and every descriptor received is closed.
// A descriptor with a request other than a put, a truncated or oversized
// message, or an unknown op also ends the connection.

// ObjectSocket is the object socket's path, named after the local API's
// (sidecar.sock: sidecar.obj.sock).
func ObjectSocket(apiSocket string) string {
	return strings.TrimSuffix(apiSocket, ".sock") + ".obj.sock"
}

var objMagic = [4]byte{'Z', 'T', 'O', '1'}

const (
	objHello = 1
	objPut   = 2
	objGet   = 3

	objOK       = 0
	objError    = 1
	objFallback = 2

	// maxObjRequest bounds a request (a reference or a session name).
	maxObjRequest = 16 << 10
	// maxObjResponse bounds a response (a reference, or an error).
	maxObjResponse = 16 << 10
	objPutFixed    = 4 + 1 + 4 + 8 + 8 + 2

	helloSameNode = 1
)

// SameNodeGetter hands a same-node consumer's sidecar the sealed memfd of
// a referenced object held by a producer on its node (the sidecar's
// samenode client); ok false when the reference's producer is elsewhere
// or the path failed in a way the TCP pull may not (then the gRPC Get
// pulls it).
type SameNodeGetter func(ctx context.Context, r string) (obj *samenode.Object, ok bool, err error)

// ListenObjects opens the object socket (SOCK_SEQPACKET), replacing a
// stale one; mode 0666 like the API's (the function may run as another
// user).
func ListenObjects(apiSocket string) (*net.UnixListener, error) {
	path := ObjectSocket(apiSocket)
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("object socket: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		_ = ln.Close()
		return nil, err
	}
	return ln, nil
}

// ServeObjects answers the object socket on ln until it closes (Stop
// closes it).
func (s *Server) ServeObjects(ln *net.UnixListener) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return ln.Close()
	}
	s.objLn = ln
	s.mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.AcceptUnix()
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
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			_ = c.Close()
			return nil
		}
		if s.objConns == nil {
			s.objConns = map[*net.UnixConn]struct{}{}
		}
		s.objConns[c] = struct{}{}
		s.mu.Unlock()
		wg.Go(func() {
			defer recovery.Recover("queue-proxy-zl", "object socket conn")
			defer func() {
				s.mu.Lock()
				delete(s.objConns, c)
				s.mu.Unlock()
				_ = c.Close()
			}()
			s.serveObjConn(c)
		})
	}
}

func (s *Server) serveObjConn(c *net.UnixConn) {
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		bp, n, oobn, flags, err := recvObj(c, oob)
		fds := samenode.Rights(oob[:oobn])
		if err != nil || n == 0 {
			samenode.CloseFDs(fds)
			if bp != nil {
				objBuffers.Put(bp)
			}
			return
		}
		more := s.serveObjMsg(c, (*bp)[:n], flags, fds)
		objBuffers.Put(bp)
		if !more {
			return
		}
	}
}

// recvObj receives one message into a pooled buffer, taken only once the
// message is there: an idle connection holds none, so the sidecar's
// memory for the object socket follows the messages in flight, not the
// connections a function opened.
func recvObj(c *net.UnixConn, oob []byte) (bp *[]byte, n, oobn, flags int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, 0, 0, 0, err
	}
	rerr := rc.Read(func(fd uintptr) bool {
		b := objBuffers.Get().(*[]byte)
		n, oobn, flags, _, err = unix.Recvmsg(int(fd), *b, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EAGAIN {
			objBuffers.Put(b)
			return false // wait until readable, holding nothing
		}
		bp = b
		return true
	})
	if err == nil {
		err = rerr
	}
	if err != nil && bp != nil {
		objBuffers.Put(bp)
		bp = nil
	}
	return bp, n, oobn, flags, err
}

// serveObjMsg answers one message; false ends the connection.
func (s *Server) serveObjMsg(c *net.UnixConn, buf []byte, flags int, fds []int) bool {
	n := len(buf)
	// Only a put of bytes carries more than maxObjRequest.
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n < len(objMagic)+1 || [4]byte(buf[:4]) != objMagic ||
		(n > len(objMagic)+1+maxObjRequest && buf[4] != objPutBytes) {
		samenode.CloseFDs(fds)
		objFrames.WithLabelValues("bad_frame").Inc()
		_ = objReply(c, errReply(fmt.Errorf("%w: malformed object-socket request", ErrBadPayload)), -1)
		return false
	}
	var (
		out  []byte
		fd   = -1
		keep = true
		sent *os.File // a get's memfd, closed once sent
	)
	switch op, req := buf[4], buf[5:n]; op {
	case objHello:
		keep = len(fds) == 0
		samenode.CloseFDs(fds)
		var fl byte
		if s.SameNodeGet != nil || s.Adopter != nil {
			fl |= helloSameNode
		}
		fl |= helloBytes
		out = append(objHeader(objOK), fl)
	case objPut:
		out = s.objPut(req, fds)
	case objPutBytes:
		keep = len(fds) == 0
		samenode.CloseFDs(fds)
		if keep {
			out = s.objPutBytes(req)
		}
	case objGetAny:
		keep = len(fds) == 0
		samenode.CloseFDs(fds)
		if keep {
			reply := objBuffers.Get().(*[]byte) // the answer is built in it (objbytes.go)
			defer objBuffers.Put(reply)
			out, sent = s.objGetAny(req, (*reply)[:0])
		}
		if sent != nil {
			fd = int(sent.Fd())
		}
	case objGet:
		keep = len(fds) == 0
		samenode.CloseFDs(fds)
		if keep {
			out, sent = s.objGet(req)
		}
		if sent != nil {
			fd = int(sent.Fd())
		}
	default:
		samenode.CloseFDs(fds)
		objFrames.WithLabelValues("bad_frame").Inc()
		_ = objReply(c, errReply(fmt.Errorf("%w: unknown object-socket op %d", ErrBadPayload, op)), -1)
		return false
	}
	if !keep {
		out = errReply(fmt.Errorf("%w: descriptors are only accepted with a put", ErrBadPayload))
	}
	err := objReply(c, out, fd)
	if sent != nil {
		_ = sent.Close()
	}
	return err == nil && keep
}

func objHeader(st byte) []byte { return append(objMagic[:4:4], st) }

// errReply encodes err with its class, as a gRPC status would carry it.
func errReply(err error) []byte {
	st, _ := status.FromError(toStatus(err))
	b := objHeader(objError)
	b = binary.LittleEndian.AppendUint32(b, uint32(st.Code()))
	reason := Reason(st.Err())
	b = binary.LittleEndian.AppendUint16(b, uint16(len(reason)))
	b = append(b, reason...)
	msg := st.Message()
	if room := maxObjResponse - len(b); len(msg) > room {
		msg = msg[:room]
	}
	return append(b, msg...)
}

func objReply(c *net.UnixConn, b []byte, fd int) error {
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	_, _, err := c.WriteMsgUnix(b, oob, nil)
	return err
}

// objPut takes a function's sealed memfd as a new object (see the
// package comment above for what is refused).
func (s *Server) objPut(req []byte, fds []int) []byte {
	reply, err := s.adoptPut(req, fds)
	if err != nil {
		objFrames.WithLabelValues("put_refused").Inc()
		return errReply(err)
	}
	objFrames.WithLabelValues("put").Inc()
	return reply
}

func (s *Server) adoptPut(req []byte, fds []int) ([]byte, error) {
	if len(fds) != 1 {
		samenode.CloseFDs(fds)
		return nil, fmt.Errorf("%w: a put carries exactly one descriptor, got %d", ErrBadPayload, len(fds))
	}
	f := os.NewFile(uintptr(fds[0]), "put-memfd")
	owned := false
	defer func() {
		if !owned {
			_ = f.Close()
		}
	}()
	if len(req) < objPutFixed-5 {
		return nil, fmt.Errorf("%w: short put request", ErrBadPayload)
	}
	reads := binary.LittleEndian.Uint32(req)
	ttl := int64(binary.LittleEndian.Uint64(req[4:]))
	size := binary.LittleEndian.Uint64(req[12:])
	sl := int(binary.LittleEndian.Uint16(req[20:]))
	if len(req) != 22+sl {
		return nil, fmt.Errorf("%w: put request of %d bytes, session of %d", ErrBadPayload, len(req), sl)
	}
	session := string(req[22:])
	if size == 0 {
		return nil, fmt.Errorf("%w: a put's memfd holds at least one byte", ErrBadPayload)
	}
	if size > uint64(s.limit()) || size > math.MaxInt64 {
		return nil, fmt.Errorf("%w: %d bytes, cap %d", store.ErrTooLarge, size, s.limit())
	}
	id, err := sealedInode(fds[0], int64(size))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	ad := s.adoption()
	if !ad.claim(id) {
		return nil, fmt.Errorf("%w: this memfd is already the storage of an object here (a descriptor is handed over once)", ErrBadPayload)
	}
	data, err := unix.Mmap(fds[0], 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		ad.unclaim(id)
		return nil, fmt.Errorf("%w: map the memfd: %v", ErrBadPayload, err)
	}
	if reads == 0 {
		reads = 1
	}
	m := store.Meta{ID: s.newID("put"), Session: session, Reads: reads, Expires: s.now().Add(s.ttl(ttl))}
	obj := &loaded{data: data, free: func() {
		ad.forget(m.ID, id)
		_ = unix.Munmap(data)
		_ = f.Close()
	}}
	ad.add(m.ID, f)
	owned = true
	ctx, cancel := context.WithTimeout(context.Background(), s.putWait())
	defer cancel()
	r, err := s.put(ctx, m, obj)
	if err != nil {
		if obj.free != nil { // the store did not take it
			obj.free()
		}
		return nil, err
	}
	if s.Adopter != nil {
		if df, err := dupFile(f); err == nil {
			if s.Adopter.Adopt(m.ID, df, int64(size)) != nil {
				_ = df.Close()
			}
		}
	}
	return append(objHeader(objOK), r...), nil
}

func (s *Server) putWait() time.Duration {
	if s.PutTimeout > 0 {
		return s.PutTimeout + time.Second
	}
	return 31 * time.Second
}

// memfdID names a memfd's storage (its inode).
type memfdID struct{ dev, ino uint64 }

// sealedInode checks that fd is a memfd carrying samenode.RequiredSeals,
// a regular file of exactly size bytes, and returns its inode.
func sealedInode(fd int, size int64) (memfdID, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return memfdID{}, fmt.Errorf("the descriptor is not a sealable memfd (%v)", err)
	}
	if seals&samenode.RequiredSeals != samenode.RequiredSeals {
		return memfdID{}, fmt.Errorf("the memfd is not sealed against writing, shrinking and growing (seals %#x, need %#x)", seals, samenode.RequiredSeals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return memfdID{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size {
		return memfdID{}, fmt.Errorf("the memfd holds %d bytes, the put announced %d", st.Size, size)
	}
	return memfdID{dev: st.Dev, ino: st.Ino}, nil
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// objGet answers a get with the object's sealed memfd when there is
// one: an object of this pod adopted from a function, or one a producer
// on this node handed over. The read counts as any get.
func (s *Server) objGet(req []byte) ([]byte, *os.File) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kr, err := s.keys(ctx)
	if err != nil {
		return errReply(err), nil
	}
	r := string(req)
	rec, err := kr.Open(r, s.now())
	if errors.Is(err, ref.ErrExpired) {
		// A keep-alive may have extended it: the gRPC Get knows.
		return objHeader(objFallback), nil
	}
	if err != nil {
		return errReply(err), nil
	}
	if rec.Addr == s.Addr {
		return s.objGetLocal(rec.Key)
	}
	if s.SameNodeGet == nil {
		return objHeader(objFallback), nil
	}
	o, ok, err := s.SameNodeGet(ctx, r)
	if !ok {
		objFrames.WithLabelValues("get_fallback").Inc()
		return objHeader(objFallback), nil
	}
	if err != nil {
		return errReply(err), nil
	}
	objFrames.WithLabelValues("get_memfd").Inc()
	return getReply(o.Size, "remote"), o.File
}

func (s *Server) objGetLocal(id string) ([]byte, *os.File) {
	f := s.adoption().file(id)
	if f == nil {
		objFrames.WithLabelValues("get_fallback").Inc()
		return objHeader(objFallback), nil
	}
	lease, err := s.Store.Read(id)
	if err != nil {
		_ = f.Close()
		return errReply(err), nil
	}
	defer lease.Release()
	objFrames.WithLabelValues("get_memfd").Inc()
	return getReply(int64(len(lease.Data)), "local"), f
}

func getReply(size int64, source string) []byte {
	b := binary.LittleEndian.AppendUint64(objHeader(objOK), uint64(size))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(source)))
	return append(b, source...)
}

// adopted tracks the memfds that are objects' storage: by object (a get
// hands a duplicate out) and by inode (the same memfd put twice is
// refused: two objects, one storage, counted twice).
type adopted struct {
	mu    sync.Mutex
	byID  map[string]*os.File
	inode map[memfdID]bool
}

func (s *Server) adoption() *adopted {
	s.adoptOnce.Do(func() { s.adopted = &adopted{byID: map[string]*os.File{}, inode: map[memfdID]bool{}} })
	return s.adopted
}

func (a *adopted) claim(id memfdID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inode[id] {
		return false
	}
	a.inode[id] = true
	return true
}

func (a *adopted) unclaim(id memfdID) {
	a.mu.Lock()
	delete(a.inode, id)
	a.mu.Unlock()
}

func (a *adopted) add(obj string, f *os.File) {
	a.mu.Lock()
	a.byID[obj] = f
	a.mu.Unlock()
}

func (a *adopted) forget(obj string, id memfdID) {
	a.mu.Lock()
	delete(a.byID, obj)
	delete(a.inode, id)
	a.mu.Unlock()
}

// file is a duplicate of the object's memfd, or nil.
func (a *adopted) file(obj string) *os.File {
	a.mu.Lock()
	defer a.mu.Unlock()
	f := a.byID[obj]
	if f == nil {
		return nil
	}
	df, err := dupFile(f)
	if err != nil {
		return nil
	}
	return df
}

// held is the number of adopted memfds (tests).
func (a *adopted) held() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.byID)
}

// objError rebuilds a gRPC status from an error response, so callers
// tell its class apart as on the gRPC socket (Reason).
func objStatus(b []byte) error {
	if len(b) < 6 {
		return status.Error(codes.Internal, "local API: malformed object-socket error")
	}
	code := codes.Code(binary.LittleEndian.Uint32(b))
	rl := int(binary.LittleEndian.Uint16(b[4:]))
	if len(b) < 6+rl {
		return status.Error(codes.Internal, "local API: malformed object-socket error")
	}
	reason, msg := string(b[6:6+rl]), string(b[6+rl:])
	if reason == "" {
		return status.Error(code, msg)
	}
	return withReason(code, reason, errors.New(msg))
}
