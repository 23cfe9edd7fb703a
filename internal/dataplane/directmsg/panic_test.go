package directmsg

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A panic answering an open on the data-plane port (here the broker's
// Check, which a request reaches) closes that connection, is counted and
// the broker answers the next open.
func TestTCPOpenPanicIsContained(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var calls atomic.Int32
	b := &TCPBroker{
		Check: func(q OpenRequest) error {
			if calls.Add(1) == 1 {
				panic("a bug reached by a peer's request")
			}
			return errors.New("refused")
		},
		Peer:  func(OpenRequest, *net.TCPAddr) error { return nil },
		Offer: func(OpenRequest, *os.File) error { return errors.New("no") },
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				var magic [4]byte
				if _, err := io.ReadFull(c, magic[:]); err != nil || magic != TCPMagic {
					c.Close()
					return
				}
				b.Serve(c)
			}()
		}
	}()
	before := testutil.ToFloat64(tcpOpens.WithLabelValues("panic"))
	q := OpenRequest{Auth: "a", Session: "s", Group: "g", From: 0, To: 1}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errNo := errors.New("nodirect")
	if _, err := OpenTCP(ctx, ln.Addr().String(), q, errNo); !errors.Is(err, errNo) {
		t.Fatalf("an open whose answer panics: %v, want the connection closed (no answer)", err)
	}
	if got := testutil.ToFloat64(tcpOpens.WithLabelValues("panic")); got != before+1 {
		t.Errorf("panics counted: %v, want %v", got, before+1)
	}
	if _, err := OpenTCP(ctx, ln.Addr().String(), q, errNo); !errors.Is(err, ErrRefused) {
		t.Fatalf("the next open: %v, want ErrRefused", err)
	}
}

// A panic in a channel's Recv (here its Alloc, which a frame's header
// reaches) is ErrFrame: the channel is closed, nothing crashes.
func TestChannelPanicIsErrFrame(t *testing.T) {
	for name, mk := range map[string]func(t *testing.T) (*Conn, *Conn){"socketpair": pair, "tcp": func(t *testing.T) (*Conn, *Conn) {
		s, r, _ := tcpPair(t)
		return s, r
	}} {
		t.Run(name, func(t *testing.T) {
			s, r := mk(t)
			r.Alloc = func(int64, int) []byte { panic("a bug reached by a peer's frame") }
			before := testutil.ToFloat64(channelPanics)
			go func() { _ = s.Send(context.Background(), 1, []byte("hello")) }()
			if _, err := r.Recv(); !errors.Is(err, ErrFrame) {
				t.Fatalf("a frame whose reading panics: %v, want ErrFrame", err)
			}
			if got := testutil.ToFloat64(channelPanics); got != before+1 {
				t.Errorf("panics counted: %v, want %v", got, before+1)
			}
			if _, err := r.Recv(); err == nil {
				t.Fatal("the channel still reads after the panic")
			}
		})
	}
}

// The same on the node messaging socket.
func TestNodeOpenPanicIsContained(t *testing.T) {
	dir, uid := t.TempDir(), "0b6c8b9e-3b1a-4c53-9a52-1f0e2d3c4b5a"
	var calls atomic.Int32
	b := &Broker{
		Check: func(OpenRequest) error {
			if calls.Add(1) == 1 {
				panic("a bug reached by a peer's request")
			}
			return errors.New("refused")
		},
		Offer: func(OpenRequest) (*os.File, error) { return nil, errors.New("no") },
	}
	if err := b.Listen(dir, uid); err != nil {
		t.Fatal(err)
	}
	go b.Serve()
	defer b.Close()
	before := testutil.ToFloat64(opens.WithLabelValues("panic"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errNo := errors.New("nodirect")
	q := OpenRequest{Auth: "a", Session: "s", Group: "g", From: 0, To: 1}
	if _, err := Open(ctx, dir, uid, q, errNo); !errors.Is(err, errNo) {
		t.Fatalf("an open whose answer panics: %v, want the connection closed (no answer)", err)
	}
	if got := testutil.ToFloat64(opens.WithLabelValues("panic")); got != before+1 {
		t.Errorf("panics counted: %v, want %v", got, before+1)
	}
	if _, err := Open(ctx, dir, uid, q, errNo); !errors.Is(err, ErrRefused) {
		t.Fatalf("the next open: %v, want ErrRefused", err)
	}
}
