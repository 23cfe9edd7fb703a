package messaging

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Raw reads and writes a socket of the small-message path (the message
// stream, the function's socket) with raw system calls on its
// non-blocking descriptor, waiting in the network poller as net.Conn
// does (deadlines and Close work as for c).
//
// Why: every system call Go makes through package syscall tells the
// runtime it may block, and a process whose threads were all idle (its
// monitor thread, sysmon, asleep) wakes sysmon at the first such call,
// which then polls every 20 µs until the process is idle again. A sidecar
// between two messages is idle, so each message paid a futex wake-up and
// a few sleeps of that thread (the largest item of the sidecars' profile
// once the goroutine hand-offs were gone). A read or write of a
// non-blocking socket never blocks, so it need not say so.
//
// Raw returns c itself when c has no descriptor.
func Raw(c net.Conn) io.ReadWriter {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &rawIO{rc: rc}
}

type rawIO struct{ rc syscall.RawConn }

func (r *rawIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			m, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			if e == syscall.EINTR {
				continue
			}
			n, errno = int(m), e
			return e != syscall.EAGAIN
		}
	})
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, os.NewSyscallError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (r *rawIO) Write(p []byte) (int, error) {
	done := 0
	var errno syscall.Errno
	err := r.rc.Write(func(fd uintptr) bool {
		for done < len(p) {
			m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[done])), uintptr(len(p)-done))
			switch e {
			case 0:
				done += int(m)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait until it can take more
			default:
				errno = e
				return true
			}
		}
		return true
	})
	switch {
	case err != nil:
		return done, err
	case errno != 0:
		return done, os.NewSyscallError("write", errno)
	}
	return done, nil
}
