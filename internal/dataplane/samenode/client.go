package samenode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

// Client is a consumer's side: it gets objects from producers on its node.
type Client struct {
	Dir  string // the node directory (DefaultDir)
	Node string // this pod's node; empty disables the path
	Keys *ref.Keyring
}

// Object is an object received as a sealed memfd. Close it when done.
type Object struct {
	File        *os.File // read-only: the seals refuse writes, truncation and growth
	Size        int64
	Bucket, Key string
}

// Close releases the descriptor.
func (o *Object) Close() error { return o.File.Close() }

// Map maps the object read-only; unmap with Unmap. No copy: the pages are
// the producer's (populated at once: a reader touches them all anyway).
func (o *Object) Map() ([]byte, error) { return o.mmap(unix.MAP_POPULATE) }

func (o *Object) mmap(flags int) ([]byte, error) {
	if o.Size == 0 {
		return []byte{}, nil
	}
	b, err := unix.Mmap(int(o.File.Fd()), 0, int(o.Size), unix.PROT_READ, unix.MAP_SHARED|flags)
	if err != nil {
		return nil, fmt.Errorf("samenode: mmap: %w", err)
	}
	return b, nil
}

// Unmap undoes Map.
func Unmap(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return unix.Munmap(b)
}

// CopyTo writes the object into w from offset 0: the one copy a consumer
// makes when its function reads a file rather than the memfd. Into a file
// the kernel copies page to page (sendfile), without mapping the object.
func (o *Object) CopyTo(w io.WriterAt) error {
	if f, ok := w.(*os.File); ok {
		if err := o.sendTo(f); err == nil || !errors.Is(err, errNoSendfile) {
			return err
		}
	}
	b, err := o.Map()
	if err != nil {
		return err
	}
	defer Unmap(b)
	if len(b) == 0 {
		return nil
	}
	_, err = w.WriteAt(b, 0)
	return err
}

// Applies reports whether rec's producer serves this node's path.
func (c *Client) Applies(rec ref.Record) bool {
	return c != nil && c.Node != "" && rec.Node == c.Node && ValidPodUID(rec.Pod)
}

// Get asks the reference's producer for the object. ErrNotApplicable:
// the producer is elsewhere; ErrUnavailable, ErrNotFound: the TCP pull
// may still succeed (it knows the tiers); ErrRefused wraps the
// producer's reason.
func (c *Client) Get(ctx context.Context, r string) (_ *Object, err error) {
	defer func() { observeGet(err) }()
	if c.Keys == nil {
		return nil, ErrNotApplicable
	}
	// The producer decides about expiry (a keep-alive may have extended
	// the object), as on the TCP path.
	rec, err := c.Keys.OpenExpired(r)
	if err != nil {
		return nil, err
	}
	if !c.Applies(rec) {
		return nil, ErrNotApplicable
	}
	if len(r)+len(magic) > MaxRequestBytes {
		return nil, fmt.Errorf("%w: reference of %d bytes", ErrRefused, len(r))
	}
	path, err := SocketPath(c.Dir, rec.Pod)
	if err != nil {
		return nil, ErrNotApplicable
	}
	var resp response
	var fds []int
	for attempt := 0; ; attempt++ {
		conn, reused, err := conns.get(ctx, path)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		var transport bool
		resp, fds, transport, err = exchange(ctx, conn, r)
		if err == nil {
			if resp.status == statusOK || resp.status == statusRefused || resp.status == statusNotFound {
				conns.put(path, conn) // the producer keeps serving it
			} else {
				_ = conn.Close()
			}
			break
		}
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		_ = conn.Close()
		if transport && reused && attempt == 0 && ctx.Err() == nil {
			continue // an idle connection the producer had closed: dial anew
		}
		return nil, err
	}
	keep := -1
	defer func() {
		for _, fd := range fds {
			if fd != keep {
				_ = unix.Close(fd)
			}
		}
	}()
	switch resp.status {
	case statusOK:
	case statusRefused:
		return nil, fmt.Errorf("%w: %s", ErrRefused, resp.msg)
	case statusNotFound:
		return nil, fmt.Errorf("%w: %s", ErrNotFound, resp.msg)
	default:
		return nil, fmt.Errorf("%w: producer: %s", ErrUnavailable, resp.msg)
	}
	if len(fds) != 1 {
		return nil, fmt.Errorf("%w: %d descriptors with the object, want 1", ErrProtocol, len(fds))
	}
	if err := checkSealed(fds[0], resp.size); err != nil {
		return nil, err
	}
	keep = fds[0]
	receivedBytes.Add(float64(resp.size))
	return &Object{File: os.NewFile(uintptr(keep), "samenode:"+rec.Key), Size: resp.size, Bucket: resp.bucket, Key: resp.key}, nil
}

// Rights are the descriptors in SCM_RIGHTS control messages (none for
// no or malformed control data). The same-node object socket, the local
// API's object socket and direct message channels all receive them so.
func Rights(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

// CloseFDs closes descriptors received with Rights that nobody keeps.
func CloseFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// Fallback reports whether a Get error means "pull over TCP instead":
// everything but the caller's own context ending.
func Fallback(err error) bool {
	return err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

var errNoSendfile = errors.New("sendfile not possible")

// sendTo copies the object into f at offset 0 with sendfile(2).
func (o *Object) sendTo(f *os.File) error {
	if o.Size == 0 {
		return nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return errNoSendfile
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return errNoSendfile
	}
	var off int64
	var serr error
	if err := rc.Write(func(dst uintptr) bool {
		for off < o.Size {
			n, err := unix.Sendfile(int(dst), int(o.File.Fd()), &off, int(min(o.Size-off, 1<<30)))
			if err == unix.EINTR || err == unix.EAGAIN {
				continue
			}
			if err != nil {
				serr = err
				return true
			}
			if n == 0 {
				serr = io.ErrUnexpectedEOF
				return true
			}
		}
		return true
	}); err != nil {
		return errNoSendfile
	}
	if serr != nil && off == 0 && (serr == unix.EINVAL || serr == unix.ENOSYS) {
		return errNoSendfile
	}
	if serr != nil {
		return fmt.Errorf("samenode: sendfile: %w", serr)
	}
	return nil
}

// exchange sends one request on conn and reads its response and the
// descriptors that came with it (the caller closes those). transport: the
// connection failed (no response), as opposed to a bad response.
func exchange(ctx context.Context, conn *net.UnixConn, r string) (_ response, fds []int, transport bool, err error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(idleTimeout))
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() && err == nil {
			err = ctx.Err() // the deadline was cut: do not reuse the connection
		}
	}()
	if _, _, err := conn.WriteMsgUnix(encodeRequest(r), nil, nil); err != nil {
		return response{}, nil, true, transportErr(ctx, err)
	}
	buf := make([]byte, maxResponseBytes+64)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	fds = Rights(oob[:oobn])
	if err == nil && n == 0 {
		err = io.EOF // the producer closed the connection
	}
	if err != nil {
		return response{}, fds, true, transportErr(ctx, err)
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return response{}, fds, false, fmt.Errorf("%w: truncated response", ErrProtocol)
	}
	resp, err := decodeResponse(buf[:n])
	return resp, fds, false, err
}

func transportErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %v", ErrUnavailable, err)
}

// conns keeps idle connections to producers' sockets, so a get is one
// round trip on an open connection (the producer ends idle ones after
// idleTimeout; those younger than maxIdle are reused).
var conns = &connPool{idle: map[string][]idleConn{}}

const (
	maxIdlePerSocket = 4
	maxIdle          = idleTimeout / 2
)

type connPool struct {
	mu   sync.Mutex
	idle map[string][]idleConn
}

type idleConn struct {
	c     *net.UnixConn
	since time.Time
}

func (p *connPool) get(ctx context.Context, path string) (*net.UnixConn, bool, error) {
	p.mu.Lock()
	for l := p.idle[path]; len(l) > 0; l = p.idle[path] {
		ic := l[len(l)-1]
		p.idle[path] = l[:len(l)-1]
		if time.Since(ic.since) < maxIdle {
			p.mu.Unlock()
			return ic.c, true, nil
		}
		_ = ic.c.Close()
	}
	delete(p.idle, path)
	p.mu.Unlock()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, false, err
	}
	return nc.(*net.UnixConn), false, nil
}

func (p *connPool) put(path string, c *net.UnixConn) {
	_ = c.SetDeadline(time.Time{})
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle[path]) >= maxIdlePerSocket {
		_ = c.Close()
		return
	}
	p.idle[path] = append(p.idle[path], idleConn{c: c, since: time.Now()})
}
