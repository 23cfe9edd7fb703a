package servers

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortIsOutsideTheKernelsRange: a free port comes from below the
// kernel's ephemeral range (where outgoing connections take theirs) and
// Kubernetes' NodePorts, and can be listened on, on every address.
func TestFreePortIsOutsideTheKernelsRange(t *testing.T) {
	low := ephemeralLow()
	for range 20 {
		port := FreePort(t)
		if (low == 0 || low >= freePortsTo) && (port < freePortsFrom || port >= freePortsTo) {
			t.Errorf("port %d, want one in [%d, %d) (the kernel's ephemeral ports start at %d)", port, freePortsFrom, freePortsTo, low)
		}
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("listen on the free port: %v", err)
		}
		ln.Close()
	}
}
