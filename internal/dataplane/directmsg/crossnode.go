package directmsg

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Opening a direct channel across nodes: the sender's sidecar connects to
// the receiver's data-plane port (the one its message stream uses; the
// chart's NetworkPolicy opens it to the namespace only) and asks, one
// message each way, on the connection that becomes the channel:
//
//	request:  "ZTC1", u16 length, then an open request as on the node
//	          socket (node.go: "ZTN1", auth, session, group, from, to)
//	response: "ZTC1", u8 status (0 direct, 1 nodirect, 2 refused),
//	          u16 reason length, reason
//
// little endian. After a direct answer neither sidecar reads or writes
// the connection again: each hands its end to its function (the
// receiver's on the member channel, the sender's as the open's answer)
// and closes its own descriptor. The receiving sidecar answers direct
// only for a request whose authenticator opens with its namespace's keys
// for that session and group, from the address the group's view gives
// the sender's rank, to a rank it runs attached that takes TCP channels.

// TCPMagic starts an open on the data-plane port (pull.Server tells it
// from pull and message streams by these four bytes).
var TCPMagic = [4]byte{'Z', 'T', 'C', '1'}

// openTimeout bounds a peer's request or answer (the receiving side
// does not wait on a peer that sends half a request).
const openTimeout = 10 * time.Second

// channelKeepAlive ends a TCP channel whose peer's node went silent (no
// FIN, no reset: powered off, cut off) within about 3 s: a probe after
// 1 s without traffic, two unanswered 1 s apart. Set by the sidecars on
// the socket they hand over, so both SDKs' ends have it. Its receiver
// learns of an ended peer sooner from the view (the SDKs' goneGrace).
var channelKeepAlive = net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 2}

// channelOptions sets what a channel's socket needs before it is handed
// over.
func channelOptions(c *net.TCPConn) {
	_ = c.SetNoDelay(true)
	_ = c.SetKeepAliveConfig(channelKeepAlive)
}

// tcpOpens counts the data-plane port's opens by result: direct,
// nodirect, refused_auth, refused_malformed, bad_peer, panic.
var tcpOpens = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ziptrail_messages_direct_tcp_opens_total",
	Help: "Requests for a direct channel across nodes on this pod's data-plane port, by result.",
}, []string{"result"})

func init() { prometheus.MustRegister(tcpOpens) }

// TCPBroker answers opens on the data-plane port.
type TCPBroker struct {
	// Check opens the request's authenticator (an error: refused).
	Check func(q OpenRequest) error
	// Peer checks that the connection comes from the address the group's
	// view gives the sender's rank (an error: refused).
	Peer func(q OpenRequest, remote *net.TCPAddr) error
	// Offer queues f, the connection's descriptor, for the receiving
	// member (taking it over); an error is answered nodirect and f is
	// closed.
	Offer func(q OpenRequest, f *os.File) error
}

// Serve answers the open on nc, whose magic the data-plane listener read.
// A panic (a peer's bytes the code did not expect) closes nc, counted
// (result "panic") and logged: the sidecar goes on.
func (b *TCPBroker) Serve(nc net.Conn) {
	defer nc.Close()
	defer recovered(tcpOpens, fmt.Sprint("the direct-channel open from ", nc.RemoteAddr()))
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		tcpOpens.WithLabelValues("bad_peer").Inc()
		return
	}
	_ = tc.SetDeadline(time.Now().Add(openTimeout))
	var n [2]byte
	if _, err := io.ReadFull(tc, n[:]); err != nil {
		tcpOpens.WithLabelValues("refused_malformed").Inc()
		return
	}
	size := int(binary.LittleEndian.Uint16(n[:]))
	if size > MaxOpenRequest {
		tcpOpens.WithLabelValues("refused_malformed").Inc()
		_ = tcpReply(tc, statusRefused, "request too large")
		return
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(tc, buf); err != nil {
		tcpOpens.WithLabelValues("refused_malformed").Inc()
		return
	}
	q, err := decodeOpen(buf)
	if err != nil {
		tcpOpens.WithLabelValues("refused_malformed").Inc()
		_ = tcpReply(tc, statusRefused, err.Error())
		return
	}
	if err := b.Check(q); err != nil {
		tcpOpens.WithLabelValues("refused_auth").Inc()
		_ = tcpReply(tc, statusRefused, err.Error())
		return
	}
	if err := b.Peer(q, tc.RemoteAddr().(*net.TCPAddr)); err != nil {
		tcpOpens.WithLabelValues("bad_peer").Inc()
		_ = tcpReply(tc, statusRefused, err.Error())
		return
	}
	channelOptions(tc)
	f, err := tc.File()
	if err == nil {
		if err = b.Offer(q, f); err != nil {
			_ = f.Close()
		}
	}
	if err != nil {
		tcpOpens.WithLabelValues("nodirect").Inc()
		_ = tcpReply(tc, statusNoDirect, err.Error())
		return
	}
	// Queued first, answered then: a sender told direct always has a
	// receiver (one that is gone by then closes its end: the sender's
	// writes fail, PeerGone).
	tcpOpens.WithLabelValues("direct").Inc()
	_ = tcpReply(tc, statusDirect, "")
}

func tcpReply(c *net.TCPConn, st byte, msg string) error {
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	b := append(append([]byte{}, TCPMagic[:]...), st)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	_, err := c.Write(append(b, msg...))
	return err
}

// OpenTCP asks the receiver's sidecar at addr (its data-plane address)
// for a direct channel across nodes: the sender's end, or an error
// wrapping errNoDirect (answered nodirect, or unreachable) or ErrRefused.
func OpenTCP(ctx context.Context, addr string, q OpenRequest, errNoDirect error) (*os.File, error) {
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoDirect, err)
	}
	c := nc.(*net.TCPConn)
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	req := q.encode()
	b := append(append([]byte{}, TCPMagic[:]...), 0, 0)
	binary.LittleEndian.PutUint16(b[4:], uint16(len(req)))
	if _, err := c.Write(append(b, req...)); err != nil {
		return nil, fmt.Errorf("%w: %v", errNoDirect, err)
	}
	var h [7]byte
	if _, err := io.ReadFull(c, h[:]); err != nil || [4]byte(h[:4]) != TCPMagic {
		return nil, fmt.Errorf("%w: no answer from the receiver's sidecar (%v)", errNoDirect, err)
	}
	reason := make([]byte, binary.LittleEndian.Uint16(h[5:]))
	if _, err := io.ReadFull(c, reason); err != nil {
		return nil, fmt.Errorf("%w: a cut answer from the receiver's sidecar (%v)", errNoDirect, err)
	}
	switch h[4] {
	case statusDirect:
		if !stop() {
			return nil, fmt.Errorf("%w: %v", errNoDirect, context.Cause(ctx))
		}
		_ = c.SetDeadline(time.Time{})
		channelOptions(c)
		f, err := c.File()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errNoDirect, err)
		}
		return f, nil
	case statusRefused:
		return nil, fmt.Errorf("%w: %s", ErrRefused, reason)
	default:
		return nil, fmt.Errorf("%w: %s", errNoDirect, reason)
	}
}
