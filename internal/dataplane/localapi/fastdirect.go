package localapi

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/recovery"
)

// The fast path's member channel and direct channels (docs/messaging.md,
// "Same-node direct channels"):
//
//	op 3 attach: flags bit 0 mailbox, bit 2 lend files (msgfiles.go),
//	             bit 4 take TCP channels (direct channels across nodes),
//	             rank, peer = the group's size,
//	             timeout ms bounds the join, payload = the invocation id.
//	             The sidecar joins the rank attached to this connection
//	             and answers as a join (ok: flags bit 1 mailbox group);
//	             then the connection belongs to that member: the sidecar
//	             pushes, in order, responses of three kinds (the status
//	             byte): 0 a message (as a recv's response), 2 the group's
//	             view (body: u64 epoch, u32 size, u8 mailbox, u32 live
//	             count, live ranks u32, u32 gone count, gone ranks u32),
//	             3 a direct channel from rank `from` (its receiving end
//	             attached, SCM_RIGHTS). A message in a file has flags bit
//	             0 (the body is its path), and when lent bit 3 (the body is
//	             the path, a NUL and the release token). The function
//	             sends nothing more but, when it asked to be lent files,
//	             op 5 release requests (payload: tokens, comma-separated;
//	             no response); closing the connection detaches (the
//	             membership stays).
//	op 4 open:   rank (sender), peer (receiver), flags bit 4: a TCP
//	             channel across nodes will do. ok with flags bit 2 and
//	             the sending end attached: direct; ok without: nodirect
//	             (the reason says why), for the group's lifetime.
const (
	opAttach = 3
	opOpen   = 4

	pushMessage = 0
	pushView    = 2
	pushDirect  = 3

	flagMailbox = 2
	flagDirect  = 4
	// flagTCP (attach and open): the SDK reads and writes direct
	// channels across nodes, TCP sockets (directmsg/stream.go).
	flagTCP = 16
)

// serveAttach joins q's rank attached to c and pushes its member channel
// until the member ends or the function closes c.
func (s *Server) serveAttach(c net.Conn, r *bufio.Reader, w *bufio.Writer, q *msgRequest) {
	defer messaging.PutBuf(q.buf)
	rt, err := s.router()
	if err != nil {
		_ = writeMsgResponse(w, errorResponse(err))
		return
	}
	jctx, jcancel := context.WithCancel(context.Background())
	if q.timeoutMs > 0 {
		jctx, jcancel = context.WithTimeout(context.Background(), time.Duration(q.timeoutMs)*time.Millisecond)
	}
	v, att, err := rt.JoinAttached(jctx, q.session, q.group, q.rank, q.peer, q.flags&1 != 0, string(q.payload), q.flags&flagTCP != 0)
	jcancel()
	if att == nil {
		if err == nil {
			err = messaging.ErrClosed
		}
		_ = writeMsgResponse(w, errorResponse(err))
		return
	}
	defer att.Detach()
	ok := &msgResponse{}
	if v.Mailbox {
		ok.flags |= flagMailbox
	}
	if writeMsgResponse(w, ok) != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The function sends nothing more but releases of lent files (when
	// it asked to be lent them): any other read that returns means it
	// closed its end (or broke the protocol).
	lend := q.flags&flagLendFiles != 0
	go func() {
		defer recovery.Recover("queue-proxy-zl", "direct channel releases")
		defer func() {
			cancel()
			_ = c.SetWriteDeadline(time.Now()) // a write blocked on a function that is gone
		}()
		if !lend {
			_, _ = r.Peek(1)
			return
		}
		s.readReleases(r)
	}()
	uc, _ := c.(*net.UnixConn)
	var epoch uint64
	for {
		p, err := att.Next(ctx, epoch)
		if err != nil {
			return
		}
		switch {
		case p.View != nil:
			epoch = p.View.Epoch
			err = writeMsgResponse(w, &msgResponse{status: pushView, body: viewBody(p.View)})
		case p.Direct != nil:
			err = pushFD(uc, w, &msgResponse{status: pushDirect, from: p.From}, p.Direct)
			_ = p.Direct.Close()
		default:
			m := p.Msg
			resp := &msgResponse{from: m.From, tag: m.Tag, size: m.Size, body: m.Data}
			if m.Path != "" {
				resp.flags |= 1
				resp.body = []byte(m.Path)
				if token := m.HandOut(lend); token != "" {
					resp.flags |= flagLent
					resp.body = append(append(resp.body, 0), token...)
				}
			}
			if err = writeMsgResponse(w, resp); err != nil {
				att.Unsent(*m)
			} else {
				messaging.PutBuf(m.Data)
			}
		}
		if err != nil {
			return
		}
	}
}

// readReleases takes back the files a member channel's function released
// (op opRelease), until it closes its end or sends anything else.
func (s *Server) readReleases(r *bufio.Reader) {
	for {
		q, err := readMsgRequest(r)
		if err != nil {
			return
		}
		ok := q.op == opRelease && len(q.payload) <= maxReleaseBytes
		if ok && len(q.payload) > 0 {
			tokens := strings.Split(string(q.payload), ",")
			s.files(context.Background()).release(tokens)
			if s.ReleaseTaken != nil {
				s.ReleaseTaken(tokens)
			}
		}
		messaging.PutBuf(q.buf)
		if !ok {
			return
		}
	}
}

func viewBody(v *controlv1.GroupView) []byte {
	b := binary.LittleEndian.AppendUint64(nil, v.Epoch)
	b = binary.LittleEndian.AppendUint32(b, v.Size)
	if v.Mailbox {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(v.Members)))
	for _, m := range v.Members {
		b = binary.LittleEndian.AppendUint32(b, m.Rank)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(v.Gone)))
	for _, g := range v.Gone {
		b = binary.LittleEndian.AppendUint32(b, g)
	}
	return b
}

// pushFD writes a response with f attached, in one sendmsg (the
// descriptor arrives with the response's first byte).
func pushFD(uc *net.UnixConn, w *bufio.Writer, p *msgResponse, f *os.File) error {
	if uc == nil {
		return errors.New("not a unix socket")
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, _, err := uc.WriteMsgUnix(appendMsgResponse(nil, p), unix.UnixRights(int(f.Fd())), nil)
	return err
}

// answerOpen answers an open: the sending end of a direct channel, or
// nodirect.
func (s *Server) answerOpen(c net.Conn, w *bufio.Writer, q *msgRequest) error {
	messaging.PutBuf(q.buf)
	rt, err := s.router()
	if err != nil {
		return writeMsgResponse(w, errorResponse(err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	f, err := rt.OpenDirect(ctx, q.session, q.group, q.rank, q.peer, q.flags&flagTCP != 0)
	cancel()
	switch {
	case f != nil:
		defer f.Close()
		uc, _ := c.(*net.UnixConn)
		return pushFD(uc, w, &msgResponse{flags: flagDirect}, f)
	case errors.Is(err, messaging.ErrClosed) || errors.Is(err, messaging.ErrInvalid):
		return writeMsgResponse(w, errorResponse(err))
	default:
		return writeMsgResponse(w, &msgResponse{reason: err.Error()})
	}
}
