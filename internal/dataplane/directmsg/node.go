package directmsg

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// The node messaging socket: <node dir>/<pod UID>.msg.sock, SOCK_SEQPACKET,
// mode 0600 in the node directory that only queue-proxy containers mount
// (docs/samenode.md), peers checked with SO_PEERCRED. A sender's sidecar
// asks the receiver's for a direct channel, one message each way:
//
//	request:  "ZTN1", u16 auth length, auth, u16 session length, session,
//	          u16 group length, group, u32 from, u32 to
//	response: "ZTN1", u8 status (0 direct: one socketpair end attached,
//	          1 nodirect, 2 refused), then a reason as text
//
// little endian. The receiving sidecar never accepts descriptors: a
// request carrying any is refused (and they are closed). It creates the
// socketpair itself, only for a request whose authenticator opens with
// its namespace's keys for that session and group and that names a rank
// it runs, attached.

var nodeMagic = [4]byte{'Z', 'T', 'N', '1'}

const (
	statusDirect   = 0
	statusNoDirect = 1
	statusRefused  = 2

	// MaxOpenRequest bounds a request (an authenticator and two names).
	MaxOpenRequest = 8 << 10
)

// ErrRefused: the receiving sidecar refused the request (its
// authenticator, or its form).
var ErrRefused = errors.New("direct channel refused")

// NodeSocket is a pod's node messaging socket in dir.
func NodeSocket(dir, podUID string) (string, error) {
	if !samenode.ValidPodUID(podUID) {
		return "", fmt.Errorf("pod UID %q is not a UUID", podUID)
	}
	return filepath.Join(dir, podUID+".msg.sock"), nil
}

// OpenRequest is what a sender's sidecar asks.
type OpenRequest struct {
	Auth, Session, Group string
	From, To             uint32
}

func (q OpenRequest) encode() []byte {
	b := append([]byte{}, nodeMagic[:]...)
	for _, s := range []string{q.Auth, q.Session, q.Group} {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	b = binary.LittleEndian.AppendUint32(b, q.From)
	return binary.LittleEndian.AppendUint32(b, q.To)
}

func decodeOpen(b []byte) (OpenRequest, error) {
	if len(b) < 4 || [4]byte(b[:4]) != nodeMagic {
		return OpenRequest{}, errors.New("bad magic")
	}
	b = b[4:]
	var ss [3]string
	for i := range ss {
		if len(b) < 2 || len(b)-2 < int(binary.LittleEndian.Uint16(b)) {
			return OpenRequest{}, errors.New("short request")
		}
		n := int(binary.LittleEndian.Uint16(b))
		ss[i], b = string(b[2:2+n]), b[2+n:]
	}
	if len(b) != 8 {
		return OpenRequest{}, errors.New("bad length")
	}
	return OpenRequest{Auth: ss[0], Session: ss[1], Group: ss[2], From: binary.LittleEndian.Uint32(b), To: binary.LittleEndian.Uint32(b[4:])}, nil
}

// Broker serves a pod's node messaging socket.
type Broker struct {
	// Check opens the request's authenticator (an error: refused).
	Check func(q OpenRequest) error
	// Offer makes the channel for an authenticated request: the sender's
	// end, or an error wrapping ErrNoDirect-like reasons (answered
	// nodirect).
	Offer func(q OpenRequest) (*os.File, error)
	// AllowUID decides which peers may connect; default: this process's
	// uid only.
	AllowUID func(uid uint32) bool

	mu     sync.Mutex
	ln     *net.UnixListener
	conns  map[*net.UnixConn]struct{}
	closed bool
}

// Listen creates the socket (a stale one of this pod's is replaced).
func (b *Broker) Listen(dir, podUID string) error {
	path, err := NodeSocket(dir, podUID)
	if err != nil {
		return err
	}
	_ = os.Remove(path)
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	unix.Umask(old)
	if err != nil {
		return fmt.Errorf("node messaging socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return err
	}
	b.mu.Lock()
	b.ln, b.conns = ln, map[*net.UnixConn]struct{}{}
	b.mu.Unlock()
	return nil
}

// Serve answers requests until Close.
func (b *Broker) Serve() {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := b.ln.AcceptUnix()
		if err != nil {
			return
		}
		b.mu.Lock()
		if b.closed || len(b.conns) >= 256 {
			b.mu.Unlock()
			opens.WithLabelValues("busy").Inc()
			_ = c.Close()
			continue
		}
		b.conns[c] = struct{}{}
		b.mu.Unlock()
		wg.Go(func() {
			b.serve(c)
			b.mu.Lock()
			delete(b.conns, c)
			b.mu.Unlock()
		})
	}
}

// Close stops serving (the socket file is removed).
func (b *Broker) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.ln != nil {
		_ = b.ln.Close()
	}
	for c := range b.conns {
		_ = c.Close()
	}
}

func (b *Broker) allowed(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return false
	}
	if b.AllowUID != nil {
		return b.AllowUID(cred.Uid)
	}
	return cred.Uid == uint32(os.Geteuid())
}

// serve answers one sender sidecar's requests on c. A panic (a peer's
// bytes the code did not expect) closes c, counted (result "panic") and
// logged: the sidecar goes on.
func (b *Broker) serve(c *net.UnixConn) {
	defer c.Close()
	defer recovered(opens, "a request on the node messaging socket")
	if !b.allowed(c) {
		opens.WithLabelValues("bad_peer").Inc()
		return
	}
	buf := make([]byte, MaxOpenRequest+1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
		fds := samenode.Rights(oob[:oobn])
		samenode.CloseFDs(fds) // never kept
		if err != nil || (n == 0 && len(fds) == 0) {
			return
		}
		var q OpenRequest
		switch {
		case len(fds) > 0 || flags&unix.MSG_CTRUNC != 0:
			err = errors.New("descriptors are never accepted")
			opens.WithLabelValues("refused_fds").Inc()
		case flags&unix.MSG_TRUNC != 0 || n > MaxOpenRequest:
			err = errors.New("request too large")
			opens.WithLabelValues("refused_malformed").Inc()
		default:
			if q, err = decodeOpen(buf[:n]); err != nil {
				opens.WithLabelValues("refused_malformed").Inc()
			} else if err = b.Check(q); err != nil {
				opens.WithLabelValues("refused_auth").Inc()
			}
		}
		if err != nil {
			_ = reply(c, statusRefused, err.Error(), nil)
			return // a peer that breaks the protocol gets no second try
		}
		f, err := b.Offer(q)
		if err != nil {
			opens.WithLabelValues("nodirect").Inc()
			if reply(c, statusNoDirect, err.Error(), nil) != nil {
				return
			}
			continue
		}
		opens.WithLabelValues("direct").Inc()
		err = reply(c, statusDirect, "", f)
		_ = f.Close()
		if err != nil {
			return
		}
	}
}

func reply(c *net.UnixConn, st byte, msg string, f *os.File) error {
	b := append(append([]byte{}, nodeMagic[:]...), st)
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	b = append(b, msg...)
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, _, err := c.WriteMsgUnix(b, oob, nil)
	return err
}

// Open asks the receiver's sidecar (pod podUID on this node) for a direct
// channel: the sender's end, or an error wrapping ErrNoDirect (answered
// nodirect, or the socket is not there) or ErrRefused.
func Open(ctx context.Context, dir, podUID string, q OpenRequest, errNoDirect error) (*os.File, error) {
	path, err := NodeSocket(dir, podUID)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoDirect, err)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoDirect, err)
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if _, _, err := c.WriteMsgUnix(q.encode(), nil, nil); err != nil {
		return nil, fmt.Errorf("%w: %v", errNoDirect, err)
	}
	buf := make([]byte, 2048)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	fds := samenode.Rights(oob[:oobn])
	if err != nil || n < 5 || [4]byte(buf[:4]) != nodeMagic {
		samenode.CloseFDs(fds)
		return nil, fmt.Errorf("%w: no answer from the receiver's sidecar (%v)", errNoDirect, err)
	}
	switch st, msg := buf[4], string(buf[5:n]); {
	case st == statusDirect && len(fds) == 1:
		return os.NewFile(uintptr(fds[0]), "direct"), nil
	case st == statusRefused:
		samenode.CloseFDs(fds)
		return nil, fmt.Errorf("%w: %s", ErrRefused, msg)
	default:
		samenode.CloseFDs(fds)
		return nil, fmt.Errorf("%w: %s", errNoDirect, msg)
	}
}
