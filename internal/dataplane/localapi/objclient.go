package localapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// MemfdMode chooses how a client's large puts travel (objsock.go).
type MemfdMode int

const (
	// MemfdAuto: as sealed memfds over the object socket when the sidecar
	// serves it with the same-node path on (a consumer on the node then
	// maps the function's own pages), else as reused files (no new pages
	// per object: cheaper when every consumer pulls over TCP).
	MemfdAuto MemfdMode = iota
	// MemfdAlways: as sealed memfds whenever the object socket is there.
	MemfdAlways
	// MemfdNever: nothing on the object socket, as before it: large puts
	// as files, small ones and every get through gRPC.
	MemfdNever
)

// objClient keeps connections to the object socket (one request at a
// time each) and what its hello said.
type objClient struct {
	path string
	mu   sync.Mutex
	free []*net.UnixConn
	// hello: asked is when it was last asked (a missing socket is asked
	// again after a while: the sidecar may start after the function).
	asked     time.Time
	served    bool
	sameNode  bool
	bytes     bool // ops 4 and 5 (objbytes.go)
	closedAll bool
}

const helloRetry = 5 * time.Second

// objectSocket reports whether the sidecar serves the object socket, and
// whether its gets of same-node objects come as descriptors.
func (c *Client) objectSocket(ctx context.Context) (served, sameNode bool) {
	h := c.hello(ctx)
	return h.served, h.sameNode
}

// objBytes reports whether small puts and gets go on the object socket
// (ops 4 and 5, objbytes.go).
func (c *Client) objBytes(ctx context.Context) bool {
	return c.Memfds != MemfdNever && c.hello(ctx).bytes
}

type helloFlags struct{ served, sameNode, bytes bool }

// hello is what the sidecar's object socket said it serves, asked once
// (again after helloRetry while it was not there).
func (c *Client) hello(ctx context.Context) helloFlags {
	o := c.obj
	if o == nil {
		return helloFlags{}
	}
	o.mu.Lock()
	if !o.asked.IsZero() && (o.served || time.Since(o.asked) < helloRetry) {
		defer o.mu.Unlock()
		return helloFlags{o.served, o.sameNode, o.bytes}
	}
	o.mu.Unlock()
	resp, fds, err := o.roundTrip(ctx, []byte{objHello}, -1)
	samenode.CloseFDs(fds)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.asked = time.Now()
	o.served = err == nil && len(resp) == 1
	o.sameNode = o.served && resp[0]&helloSameNode != 0
	o.bytes = o.served && resp[0]&helloBytes != 0
	return helloFlags{o.served, o.sameNode, o.bytes}
}

// useMemfd says whether large puts go as memfds.
func (c *Client) useMemfd(ctx context.Context) bool {
	if c.Memfds == MemfdNever {
		return false
	}
	served, sameNode := c.objectSocket(ctx)
	return served && (sameNode || c.Memfds == MemfdAlways)
}

// roundTrip sends one request (after the magic) with fd attached when
// fd >= 0, and returns the response after its magic and status byte
// folded into an error: ok gives the body, fallback errFallback, an
// error response its status.
func (o *objClient) roundTrip(ctx context.Context, req []byte, fd int) ([]byte, []int, error) {
	return o.send(ctx, append(objMagic[:4:4], req...), fd)
}

// send is roundTrip of a whole message (the magic first): a message
// built so spares a copy of a put's bytes.
func (o *objClient) send(ctx context.Context, msg []byte, fd int) ([]byte, []int, error) {
	for attempt := 0; ; attempt++ {
		conn, reused, err := o.conn(ctx)
		if err != nil {
			return nil, nil, err
		}
		body, fds, transport, err := o.exchange(ctx, conn, msg, fd)
		if err == nil || !transport {
			if transport || errors.Is(err, errObjFrame) {
				_ = conn.Close()
			} else {
				o.put(conn)
			}
			return body, fds, err
		}
		samenode.CloseFDs(fds)
		_ = conn.Close()
		if !reused || attempt > 0 || ctx.Err() != nil {
			return nil, nil, err
		}
	}
}

var (
	errFallback = errors.New("object socket: no descriptor for this object")
	errObjFrame = errors.New("object socket: malformed response")
)

func (o *objClient) exchange(ctx context.Context, conn *net.UnixConn, msg []byte, fd int) (body []byte, fds []int, transport bool, err error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if _, _, err := conn.WriteMsgUnix(msg, oob, nil); err != nil {
		return nil, nil, true, ctxErr(ctx, err)
	}
	bp := objBuffers.Get().(*[]byte)
	defer objBuffers.Put(bp)
	buf := *bp
	roob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, roob)
	fds = samenode.Rights(roob[:oobn])
	if err == nil && n == 0 {
		err = errors.New("object socket closed")
	}
	if err != nil {
		return nil, fds, true, ctxErr(ctx, err)
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n < 5 || [4]byte(buf[:4]) != objMagic {
		return nil, fds, false, errObjFrame
	}
	switch buf[4] {
	case objOK:
		return bytes.Clone(buf[5:n]), fds, false, nil
	case objFallback:
		return nil, fds, false, errFallback
	case objError:
		return nil, fds, false, objStatus(buf[5:n])
	}
	return nil, fds, false, errObjFrame
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (o *objClient) conn(ctx context.Context) (*net.UnixConn, bool, error) {
	o.mu.Lock()
	if o.closedAll {
		o.mu.Unlock()
		return nil, false, errors.New("local API client closed")
	}
	if n := len(o.free); n > 0 {
		c := o.free[n-1]
		o.free = o.free[:n-1]
		o.mu.Unlock()
		return c, true, nil
	}
	o.mu.Unlock()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", o.path)
	if err != nil {
		return nil, false, err
	}
	return nc.(*net.UnixConn), false, nil
}

func (o *objClient) put(c *net.UnixConn) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closedAll || len(o.free) >= 16 {
		_ = c.Close()
		return
	}
	o.free = append(o.free, c)
}

func (o *objClient) close() {
	o.mu.Lock()
	free := o.free
	o.free, o.closedAll = nil, true
	o.mu.Unlock()
	for _, c := range free {
		_ = c.Close()
	}
}

// ErrBufferDone: a PutBuffer was put or discarded already.
var ErrBufferDone = errors.New("buffer already put or discarded")

// PutBuffer is an object written in place (Alloc): a sealable memfd, or
// a file of the shared-memory directory (one given back by the sidecar
// when there is one), mapped writable; Put hands it over as it is, no
// copy. A small one is in the heap and goes in the put's message.
type PutBuffer struct {
	Data  []byte
	c     *Client
	memfd *os.File // memfd mode
	pf    putFile  // file mode
	small bool     // in the heap, put in the message (objbytes.go)
	done  bool
}

// Alloc makes a buffer of size bytes (zero-filled; a reused file's old
// bytes are cleared) for one put.
func (c *Client) Alloc(ctx context.Context, size int) (*PutBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("size must be positive, got %d", size)
	}
	if size <= min(c.InlineThreshold, objInlineMax) && c.objBytes(ctx) {
		return &PutBuffer{Data: make([]byte, size), c: c, small: true}, nil
	}
	if c.useMemfd(ctx) {
		f, data, err := newMemfd(size)
		if err != nil {
			return nil, err
		}
		return &PutBuffer{Data: data, c: c, memfd: f}, nil
	}
	pf, err := c.fileBuffer(int64(size))
	if err != nil {
		return nil, err
	}
	return &PutBuffer{Data: pf.mem, c: c, pf: pf}, nil
}

// newMemfd is a memfd of size bytes mapped writable, its pages allocated
// at once (one pass instead of a fault per page as the function writes).
func newMemfd(size int) (*os.File, []byte, error) {
	fd, err := unix.MemfdCreate("ziptrail-put", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:put")
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	data, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("map memfd: %w", err)
	}
	return f, data, nil
}

// fileBuffer is a file of the directory mapped writable at size bytes: a
// given-back one (through its kept mapping when the size matches), else
// a new one.
func (c *Client) fileBuffer(size int64) (putFile, error) {
	pf, ok := c.reusedPutFile()
	if ok && pf.mem != nil && int64(len(pf.mem)) == size && pf.size == size && c.stillOurs(pf) {
		clear(pf.mem) // an Alloc'd buffer starts zero-filled
		return pf, nil
	}
	var f *os.File
	var err error
	if ok {
		pf.unmap()
		if f, err = os.OpenFile(filepath.Join(c.Dir, pf.name), os.O_RDWR, 0); err != nil {
			pf.drop(c.Dir)
			ok = false
		}
	}
	if !ok {
		if f, err = os.CreateTemp(c.Dir, "put-"+c.id+"-*"); err != nil {
			return putFile{}, err
		}
		pf = putFile{name: filepath.Base(f.Name())}
	}
	defer f.Close()
	// Cut to nothing, then to size: a reused file's old bytes are gone.
	err = f.Truncate(0)
	if err == nil {
		err = f.Truncate(size)
	}
	var st syscall.Stat_t
	if err == nil {
		err = syscall.Fstat(int(f.Fd()), &st)
	}
	if err == nil {
		pf.mem, err = syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	}
	if err != nil {
		pf.drop(c.Dir)
		return putFile{}, err
	}
	pf.ino, pf.size = st.Ino, size
	return pf, nil
}

// stillOurs reports whether a given-back file is still the one this
// client mapped, whole (nobody truncated, replaced or linked it).
func (c *Client) stillOurs(pf putFile) bool {
	var st syscall.Stat_t
	err := syscall.Stat(filepath.Join(c.Dir, pf.name), &st)
	return err == nil && st.Ino == pf.ino && st.Size == pf.size && st.Nlink == 1
}

// Put hands the buffer to the sidecar with req's other fields; the
// buffer is unusable afterwards, whatever the result.
func (b *PutBuffer) Put(ctx context.Context, req *sidecarv1.PutRequest) (*sidecarv1.PutResponse, error) {
	if b.done {
		return nil, ErrBufferDone
	}
	b.done = true
	size := len(b.Data)
	if b.small {
		data := b.Data
		b.Data = nil
		return b.c.putBytes(ctx, data, req)
	}
	if b.memfd == nil {
		pf := b.pf
		pf.since = time.Now()
		b.Data = nil
		return b.c.putFilePayload(ctx, pf, req)
	}
	f := b.memfd
	defer f.Close()
	// The writable mapping must go before the seals (the kernel refuses
	// F_SEAL_WRITE while one exists).
	err := unix.Munmap(b.Data)
	b.Data = nil
	if err != nil {
		return nil, &PayloadError{Err: err}
	}
	return b.c.putMemfd(ctx, f, int64(size), req)
}

// putMemfd seals f (unless it is) and hands it over on the object socket.
func (c *Client) putMemfd(ctx context.Context, f *os.File, size int64, req *sidecarv1.PutRequest) (*sidecarv1.PutResponse, error) {
	if seals, _ := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0); seals&samenode.RequiredSeals != samenode.RequiredSeals {
		if err := samenode.AddSeals(int(f.Fd()), samenode.RequiredSeals); err != nil {
			return nil, &PayloadError{Err: fmt.Errorf("seal the memfd: %w", err)}
		}
	}
	session := req.GetSession()
	if len(session) > maxObjRequest-objPutFixed {
		return nil, fmt.Errorf("session name of %d bytes", len(session))
	}
	msg := make([]byte, 0, objPutFixed+len(session))
	msg = append(msg, objPut)
	msg = binary.LittleEndian.AppendUint32(msg, req.GetReads())
	msg = binary.LittleEndian.AppendUint64(msg, uint64(req.GetTtlMs()))
	msg = binary.LittleEndian.AppendUint64(msg, uint64(size))
	msg = binary.LittleEndian.AppendUint16(msg, uint16(len(session)))
	msg = append(msg, session...)
	body, fds, err := c.obj.roundTrip(ctx, msg, int(f.Fd()))
	samenode.CloseFDs(fds)
	if err != nil {
		return nil, err
	}
	return &sidecarv1.PutResponse{Ref: string(body), Size: size}, nil
}

// Discard drops the buffer without putting it; a no-op after Put.
func (b *PutBuffer) Discard() error {
	if b.done {
		return nil
	}
	b.done = true
	data := b.Data
	b.Data = nil
	if b.small {
		return nil
	}
	if b.memfd != nil {
		return errors.Join(unix.Munmap(data), b.memfd.Close())
	}
	b.pf.drop(b.c.Dir)
	return nil
}

// getMemfd gets an object as its sealed memfd over the object socket,
// mapped read-only; errFallback when the sidecar has none for it.
func (c *Client) getMemfd(ctx context.Context, ref string) (*sidecarv1.GetResponse, *Mapped, error) {
	body, fds, err := c.obj.roundTrip(ctx, append([]byte{objGet}, ref...), -1)
	if err != nil {
		samenode.CloseFDs(fds)
		return nil, nil, err
	}
	if len(fds) != 1 || len(body) < 10 {
		samenode.CloseFDs(fds)
		return nil, nil, fmt.Errorf("%w: get answered with %d descriptors", errObjFrame, len(fds))
	}
	size := int64(binary.LittleEndian.Uint64(body))
	sl := int(binary.LittleEndian.Uint16(body[8:]))
	if len(body) != 10+sl {
		samenode.CloseFDs(fds)
		return nil, nil, errObjFrame
	}
	resp := &sidecarv1.GetResponse{Size: size, Source: string(body[10:])}
	m, err := c.mapMemfd(os.NewFile(uintptr(fds[0]), "memfd:get"), size)
	return resp, m, err
}

// mapMemfd maps a sealed memfd a get answered with, read-only; f is the
// Mapped's (closed with it) or closed.
func (c *Client) mapMemfd(f *os.File, size int64) (*Mapped, error) {
	data, err := samenode.MapSealed(f, size)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if len(data) == 0 {
		_ = f.Close()
		return &Mapped{Data: data}, nil
	}
	return &Mapped{Data: data, Mapped: true, c: c, file: f}, nil
}
