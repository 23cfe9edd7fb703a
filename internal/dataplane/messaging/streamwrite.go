package messaging

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// joinMax bounds the bodies copied behind their header into one write
// (larger ones go out with writev, or sendfile from their file).
const joinMax = 4 << 10

// aLongTimeAgo is a deadline that has passed: a wait given it ends now.
var aLongTimeAgo = time.Unix(1, 0)

// writeMessage writes a message's frame (under the write slot): a small
// one in one raw write, a larger one with writev, a file's body with
// sendfile. What the socket takes at once goes at once; when it is full
// (the receiver reads nothing: its member's inbox is full), the write
// waits for room until ctx ends. The socket's write deadline is set only
// then, so a frame that fits costs no timer. n is how much of the frame
// was written.
func (p *peerStream) writeMessage(ctx context.Context, w *wire, data []byte, file *os.File) (n int64, err error) {
	if p.rc == nil {
		return p.writeConn(ctx, w, data, file)
	}
	fw := &p.fw // the stream's, reused: no allocation per frame
	fw.start(p, ctx)
	defer fw.done()
	if file == nil && len(data) <= joinMax {
		b := append(w.appendHeader(p.wbuf[:0]), data...)
		p.wbuf = b
		err = fw.write(b, nil)
		return fw.n, err
	}
	h := w.appendHeader(p.wbuf[:0])
	p.wbuf = h
	if file == nil {
		err = fw.write(h, data)
		return fw.n, err
	}
	if err = fw.write(h, nil); err != nil {
		return fw.n, err
	}
	err = fw.sendfile(file, int64(w.size))
	return fw.n, err
}

// frameWriter writes one frame with raw system calls on the socket's
// non-blocking descriptor (as rawIO does), waiting in the network poller
// when the socket is full. A stream has one, used under its write slot.
type frameWriter struct {
	p     *peerStream
	ctx   context.Context
	n     int64 // bytes of the frame written
	armed bool  // waits end with ctx
	stop  func() bool
	fired chan struct{}
	// write's state: what is left to write, and how a pass ended.
	a, b   []byte
	errno  syscall.Errno
	full   bool
	writes func(fd uintptr) bool // fw.writeFD, made once
}

func (fw *frameWriter) start(p *peerStream, ctx context.Context) {
	if fw.writes == nil {
		fw.writes = fw.writeFD
	}
	fw.p, fw.ctx, fw.n, fw.armed = p, ctx, 0, false
}

// arm makes the socket's waits for room end with ctx: at its deadline,
// or when it is cancelled.
func (fw *frameWriter) arm() {
	fw.armed = true
	c := fw.p.conn
	if dl, ok := fw.ctx.Deadline(); ok {
		_ = c.SetWriteDeadline(dl)
	}
	fired := make(chan struct{})
	fw.fired = fired
	fw.stop = context.AfterFunc(fw.ctx, func() {
		_ = c.SetWriteDeadline(aLongTimeAgo)
		close(fired)
	})
}

// done clears what start and arm set (before the write slot is given
// back).
func (fw *frameWriter) done() {
	if fw.armed {
		if !fw.stop() {
			<-fw.fired
		}
		_ = fw.p.conn.SetWriteDeadline(time.Time{})
		fw.stop, fw.fired = nil, nil
	}
	fw.ctx, fw.a, fw.b = nil, nil, nil
}

// write writes a, then b.
func (fw *frameWriter) write(a, b []byte) error {
	fw.a, fw.b = a, b
	for len(fw.a)+len(fw.b) > 0 {
		fw.errno, fw.full = 0, false
		err := fw.p.rc.Write(fw.writes)
		switch {
		case err != nil:
			return err
		case fw.errno != 0:
			return os.NewSyscallError("write", fw.errno)
		case fw.full:
			fw.arm()
		}
	}
	return nil
}

// writeFD is write's pass on the descriptor: what the socket takes now,
// then (once armed) a wait for room.
func (fw *frameWriter) writeFD(fd uintptr) bool {
	for len(fw.a)+len(fw.b) > 0 {
		a, b := fw.a, fw.b
		var m uintptr
		var e syscall.Errno
		switch {
		case len(a) == 0:
			fw.a, fw.b = b, nil
			continue
		case len(b) == 0:
			m, _, e = syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&a[0])), uintptr(len(a)))
		default:
			var iov [2]syscall.Iovec
			iov[0].Base, iov[1].Base = &a[0], &b[0]
			iov[0].SetLen(len(a))
			iov[1].SetLen(len(b))
			m, _, e = syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), 2)
		}
		switch e {
		case 0:
			fw.n += int64(m)
			if int(m) >= len(a) {
				fw.a, fw.b = b[int(m)-len(a):], nil
			} else {
				fw.a = a[m:]
			}
		case syscall.EINTR:
		case syscall.EAGAIN:
			if !fw.armed {
				fw.full = true
				return true // arm first, then wait
			}
			return false // wait until it can take more
		default:
			fw.errno = e
			return true
		}
	}
	return true
}

// sendfile writes size bytes of f from its start.
func (fw *frameWriter) sendfile(f *os.File, size int64) error {
	frc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var off int64
	var werr error
	cerr := frc.Control(func(in uintptr) {
		for off < size && werr == nil {
			var serr error
			full, short := false, false
			err := fw.p.rc.Write(func(out uintptr) bool {
				for off < size {
					m, e := syscall.Sendfile(int(out), int(in), &off, int(min(size-off, 1<<30)))
					switch {
					case e == syscall.EINTR:
						continue
					case e == syscall.EAGAIN:
						if !fw.armed {
							full = true
							return true
						}
						return false
					case e != nil:
						serr = os.NewSyscallError("sendfile", e)
						return true
					case m == 0:
						short = true
						return true
					}
					fw.n += int64(m)
				}
				return true
			})
			switch {
			case err != nil:
				werr = err
			case serr != nil:
				werr = serr
			case short:
				werr = fmt.Errorf("file ended after %d of %d bytes", off, size)
			case full:
				fw.arm()
			}
		}
	})
	if cerr != nil {
		return cerr
	}
	return werr
}

// writeConn is writeMessage for a connection without a descriptor: its
// writes wait until ctx ends.
func (p *peerStream) writeConn(ctx context.Context, w *wire, data []byte, file *os.File) (int64, error) {
	fw := &p.fw
	fw.start(p, ctx)
	fw.arm()
	defer fw.done()
	var n int64
	h := w.header()
	if file == nil {
		bufs := net.Buffers{h, data}
		return bufs.WriteTo(p.conn)
	}
	m, err := p.conn.Write(h)
	n += int64(m)
	if err != nil {
		return n, err
	}
	c, err := io.Copy(p.conn, io.NewSectionReader(file, 0, int64(w.size)))
	n += c
	if err == nil && uint64(c) != w.size {
		err = fmt.Errorf("file ended after %d of %d bytes", c, w.size)
	}
	return n, err
}
