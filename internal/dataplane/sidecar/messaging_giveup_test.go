package sidecar

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
)

// TestMessagingReceiveForAGoneClientLosesNothing: a function's receive
// takes a message, but its client went away before the sidecar saw it hang
// up (here it shut its reading side: the sidecar's response fails, while its
// hang-up watch has seen nothing). The message goes back to the member's
// inbox, first, and the next receive gets it, in order. It was dropped with
// the response (CI: TestMessagingWaitingReceives lost "after" under load).
func TestMessagingReceiveForAGoneClientLosesNothing(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "team-a", "pod-a")
	b := startMsgPod(t, op, "team-a", "pod-b")
	a.join(t, "s1", "w", 0, 2, false)
	b.join(t, "s1", "w", 1, 2, false)
	fa := localapi.NewMessageClient(localapi.MessageSocket(a.s.cfg.APISocket))
	fb := localapi.NewMessageClient(localapi.MessageSocket(b.s.cfg.APISocket))
	defer fa.Close()
	defer fb.Close()
	ctx, cancel := within(2 * time.Minute)
	defer cancel()

	// A receive straight to b's socket (any source, any tag, no timeout),
	// whose client then stops reading.
	c, err := net.Dial("unix", localapi.MessageSocket(b.s.cfg.APISocket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const session, group = "s1", "w"
	req := binary.LittleEndian.AppendUint32(nil, uint32(32+len(session)+len(group)))
	req = append(req, 2, 3) // recv; any source, any tag
	req = binary.LittleEndian.AppendUint16(req, uint16(len(session)))
	req = binary.LittleEndian.AppendUint16(req, uint16(len(group)))
	req = append(req, 0, 0)
	req = binary.LittleEndian.AppendUint32(req, 1) // rank
	req = binary.LittleEndian.AppendUint32(req, 0) // peer
	req = binary.LittleEndian.AppendUint64(req, 0) // tag
	req = binary.LittleEndian.AppendUint64(req, 0) // timeout: none
	req = append(append(req, session...), group...)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.UnixConn).CloseRead(); err != nil {
		t.Fatal(err)
	}

	for _, body := range []string{"first", "second"} {
		if _, err := fa.Send(ctx, session, group, 0, 1, 0, []byte(body), ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"first", "second"} {
		m, err := fb.Recv(ctx, session, group, 1, true, 0, true, 0)
		if err != nil || string(m.Data) != want {
			t.Fatalf("after a receive whose client stopped reading: %+v, %v, want %q", m, err, want)
		}
	}
}
