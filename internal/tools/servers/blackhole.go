package servers

import (
	"net"
	"net/netip"
	"os"
	"syscall"
)

// Blackhole makes addr (an IPv4 host:port; port 0 picks one) an address
// whose connection attempts are dropped without a reset, as for a lost
// node or pod: a listener with a backlog of 0 whose one queue slot a
// connection nobody accepts fills (Linux drops a SYN to a full accept
// queue; the client retransmits it until its own timeout). No privilege
// needed. It returns the address; both are closed at cleanup.
func Blackhole(t TB, addr string) string {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		t.Fatalf("blackhole %q: want an IPv4 host:port (%v)", addr, err)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "blackhole")
	defer f.Close()
	// The port may have served connections still in TIME_WAIT (a
	// producer that just went away).
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}); err != nil {
		t.Fatalf("blackhole %s: %v", addr, err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	filler, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { filler.Close() })
	return ln.Addr().String()
}
