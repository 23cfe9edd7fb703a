package pull

import (
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/recovery"
)

// TestAPanicOnTheDataPortEndsOnlyItsConnection: a panic a connection's
// bytes reach (a defect, here in the open handler) closes that connection,
// is counted, frees its slot, and the sidecar serves the next one.
func TestAPanicOnTheDataPortEndsOnlyItsConnection(t *testing.T) {
	magic := [4]byte{'P', 'N', 'C', '1'}
	s := &Server{Store: store.New(1<<20, nil), OpenMagic: magic, MaxConns: 1,
		Opens: func(nc net.Conn) {
			var b [1]byte
			if _, err := nc.Read(b[:]); err == nil && b[0] == '!' {
				panic("a defect reached by a peer's bytes")
			}
			nc.Close()
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	dial := func(b byte) net.Conn {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		if _, err := nc.Write(append(magic[:], b)); err != nil {
			t.Fatal(err)
		}
		return nc
	}
	before := testutil.ToFloat64(recovery.Counter("queue-proxy-zl", "data port conn"))
	for i := 0; i < 3; i++ { // MaxConns 1: a leaked slot would refuse the next
		closedByServer(t, dial('!'))
	}
	if n := testutil.ToFloat64(recovery.Counter("queue-proxy-zl", "data port conn")) - before; n != 3 {
		t.Errorf("panics counted: %v, want 3", n)
	}
	closedByServer(t, dial('.'))
}
