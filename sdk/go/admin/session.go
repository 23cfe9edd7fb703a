package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"iter"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/retry"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// Session states.
const (
	Running   = "Running"
	Completed = "Completed"
	Failed    = "Failed"
	Expired   = "Expired"
)

// Session is a snapshot of a workflow session.
type Session struct {
	ID, Namespace, Workflow string
	State                   string // Running, Completed, Failed or Expired
	Started, Ended          time.Time
	Invocations, Objects    int
	Error                   string // why it failed
	// The output object of a completed session, and its size.
	ResultBucket, ResultKey string
	ResultSize              int64
}

// Done reports whether the session reached a final state.
func (s *Session) Done() bool { return s.State != Running }

// Event is one step of a session's progress (Started, Invoked,
// ObjectReady, Rerun, Completed, ...).
type Event struct {
	Time          time.Time
	Kind, Message string
	State         string // the session's state after the event
}

// Result is a completed session with its output.
type Result struct {
	Session *Session
	Output  []byte
}

func dialGateway(opts Options, creds *Credentials) (*grpc.ClientConn, error) {
	// Reconnect soon after the gateway comes back (a rollout of the
	// operator): gRPC's default waits up to 2 minutes between attempts.
	dial := []grpc.DialOption{grpc.WithConnectParams(retry.GRPCReconnect)}
	if opts.GatewayDialOptions == nil {
		dial = append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	dial = append(dial, opts.GatewayDialOptions...)
	// Inputs travel in one message, up to the gateway's limit; results
	// over 1 MiB stream in chunks (OpenResult).
	dial = append(dial, grpc.WithPerRPCCredentials(creds.PerRPC()), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4<<20),
		grpc.MaxCallSendMsgSize(invocation.MaxEnvelopeBytes+1<<20)))
	return grpc.NewClient(opts.Gateway, dial...)
}

func (c *Client) gateway(op string) (gatewayv1.GatewayClient, error) {
	if c.gw == nil {
		return nil, &ziptrail.Error{Kind: ziptrail.KindInvalid, Op: op, Err: errors.New("no session gateway configured (Options.Gateway)")}
	}
	return c.gw, nil
}

// retried runs call until it succeeds, fails otherwise than UNAVAILABLE
// (the gateway unreachable, its connection broken, or the gateway asking
// to retry), or the retry budget (Options.RetryFor) is spent; it returns
// call's last error.
func (c *Client) retried(ctx context.Context, op string, call func(context.Context) error) error {
	b := retry.Backoff{For: c.retry}
	for {
		err := call(ctx)
		if err == nil || status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
		pause, ok := b.Next(0)
		if !ok {
			return err
		}
		if c.onRetry != nil {
			c.onRetry(op, err, pause)
		}
		if retry.Sleep(ctx, pause) != nil {
			return err
		}
		if c.conn != nil {
			c.conn.ResetConnectBackoff() // try to connect now, not at gRPC's next attempt
		}
	}
}

// StartSession starts a session of a workflow of the client's namespace
// with input as its entry function's input object. It carries an
// idempotency key, so retries (Options.RetryFor) of a start whose answer
// was lost answer the session it started.
func (c *Client) StartSession(ctx context.Context, workflow string, input []byte) (*Session, error) {
	gw, err := c.gateway("start session")
	if err != nil {
		return nil, err
	}
	var key [16]byte
	_, _ = rand.Read(key[:])
	kctx := metadata.AppendToOutgoingContext(ctx, gatewayv1.IdempotencyKeyMetadata, hex.EncodeToString(key[:]))
	var s *gatewayv1.Session
	err = c.retried(kctx, "start session", func(ctx context.Context) (err error) {
		s, err = gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: c.Namespace, Workflow: workflow, Input: input})
		return err
	})
	if err != nil {
		return nil, gatewayError(ctx, "start session", err)
	}
	return session(s), nil
}

// GetSession returns a session's current state.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	gw, err := c.gateway("get session")
	if err != nil {
		return nil, err
	}
	var s *gatewayv1.Session
	err = c.retried(ctx, "get session", func(ctx context.Context) (err error) {
		s, err = gw.GetSession(ctx, &gatewayv1.SessionRef{Namespace: c.Namespace, Id: id})
		return err
	})
	if err != nil {
		return nil, gatewayError(ctx, "get session", err)
	}
	return session(s), nil
}

// AckResult tells the gateway the client has a completed session's
// result: its objects are freed now rather than minutes after its first
// full read (the gateway's grace). Wait, and a reader of OpenResult read
// to its end, acknowledge by themselves.
func (c *Client) AckResult(ctx context.Context, id string) error {
	gw, err := c.gateway("acknowledge result")
	if err != nil {
		return err
	}
	err = c.retried(ctx, "acknowledge result", func(ctx context.Context) error {
		_, err := gw.AckResult(ctx, &gatewayv1.AckResultRequest{Namespace: c.Namespace, Id: id})
		return err
	})
	if err != nil {
		return gatewayError(ctx, "acknowledge result", err)
	}
	return nil
}

// ackSoon acknowledges a result the caller has, at most once and without
// retrying: unacknowledged, the gateway frees it after its grace anyway.
func (c *Client) ackSoon(ctx context.Context, id string) {
	if c.gw == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = c.gw.AckResult(ctx, &gatewayv1.AckResultRequest{Namespace: c.Namespace, Id: id})
}

// Watch streams a session's progress, from its first retained event until
// it ends (or ctx ends, or the stream fails: the last pair then carries
// the error).
func (c *Client) Watch(ctx context.Context, id string) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		gw, err := c.gateway("watch session")
		if err != nil {
			yield(Event{}, err)
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // ends the stream when the caller stops early
		stream, err := gw.WatchSession(ctx, &gatewayv1.SessionRef{Namespace: c.Namespace, Id: id})
		if err != nil {
			yield(Event{}, gatewayError(ctx, "watch session", err))
			return
		}
		for {
			e, err := stream.Recv()
			if err == io.EOF {
				return
			}
			if err != nil {
				yield(Event{}, gatewayError(ctx, "watch session", err))
				return
			}
			if !yield(Event{Time: time.UnixMilli(e.GetUnixMs()), Kind: e.GetKind(), Message: e.GetMessage(), State: e.GetState()}, nil) {
				return
			}
		}
	}
}

// waitSlice bounds one WaitSession call when ctx has no deadline (the
// gateway caps a wait anyway); the loop then asks again.
const waitSlice = time.Minute

// movingPause is the first pause before asking again about a session whose
// workflow's engine is moving between operator replicas (doubling to 1s).
const movingPause = 50 * time.Millisecond

// engineMoving: the gateway could not answer because the workflow's engine
// bucket is changing owners (gatewayv1.EngineMovingMessage); asking again soon
// reaches the new owner.
func engineMoving(err error) bool {
	st := status.Convert(err)
	return st.Code() == codes.Unavailable && strings.Contains(st.Message(), gatewayv1.EngineMovingMessage)
}

// Wait blocks until the session ends and returns its output. A failed
// session is an ErrFunctionFailed carrying its error, an expired one an
// ErrExpired; ctx ending first is an ErrTimeout.
func (c *Client) Wait(ctx context.Context, id string) (*Result, error) {
	gw, err := c.gateway("wait session")
	if err != nil {
		return nil, err
	}
	pause := movingPause
	for {
		slice := waitSlice
		if dl, ok := ctx.Deadline(); ok {
			slice = min(slice, time.Until(dl))
		}
		asked := time.Now()
		var r *gatewayv1.SessionResult
		err := c.retried(ctx, "wait session", func(ctx context.Context) (err error) {
			r, err = gw.WaitSession(ctx, &gatewayv1.WaitSessionRequest{Namespace: c.Namespace, Id: id, TimeoutMs: max(slice.Milliseconds(), 1)})
			return err
		})
		if err != nil && !engineMoving(err) {
			return nil, gatewayError(ctx, "wait session", err)
		}
		if err != nil || (r.GetSession().GetState() == Running && time.Since(asked) < slice/2) {
			// The workflow's engine is moving to another operator replica
			// (docs/sharding.md), or moved while this call waited: ask
			// again in a moment, when the gateway routes to its new owner.
			select {
			case <-ctx.Done():
				return nil, gatewayError(ctx, "wait session", ctx.Err())
			case <-time.After(pause):
			}
			pause = min(2*pause, time.Second)
			if err != nil {
				continue
			}
		} else {
			pause = movingPause
		}
		s := session(r.GetSession())
		switch s.State {
		case Completed:
			if !r.GetResultStreamed() {
				c.ackSoon(ctx, id)
				return &Result{Session: s, Output: r.GetResult()}, nil
			}
			// Too large for one message: it streams (and is acknowledged
			// once read whole).
			out, err := c.readAll(ctx, id, s.ResultSize)
			if err != nil {
				return &Result{Session: s}, err
			}
			return &Result{Session: s, Output: out}, nil
		case Failed:
			return &Result{Session: s}, &ziptrail.Error{Kind: ziptrail.KindFunctionFailed, Op: "wait session", Err: fmt.Errorf("session %s failed: %s", id, s.Error)}
		case Expired:
			return &Result{Session: s}, &ziptrail.Error{Kind: ziptrail.KindExpired, Op: "wait session", Err: fmt.Errorf("session %s passed its deadline before completing", id)}
		}
		if ctx.Err() != nil {
			return &Result{Session: s}, &ziptrail.Error{Kind: ziptrail.KindTimeout, Op: "wait session", Err: fmt.Errorf("session %s still running: %w", id, ctx.Err())}
		}
	}
}

// OpenResult streams a completed session's result, of any size, from where
// it is held (use Wait first: a session still running is an ErrUnavailable).
// The reader yields the whole result or an error; close it when done. A
// stream that breaks is opened again where it broke (Options.RetryFor);
// read to its end, the result is acknowledged (AckResult).
func (c *Client) OpenResult(ctx context.Context, id string) (io.ReadCloser, error) {
	gw, err := c.gateway("read result")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &resultReader{ctx: ctx, cancel: cancel, c: c, gw: gw, id: id}
	if err := r.open(); err != nil {
		cancel()
		return nil, gatewayError(ctx, "read result", err)
	}
	return r, nil
}

// resultReader turns ReadResult's chunks into a reader.
type resultReader struct {
	ctx    context.Context
	cancel context.CancelFunc
	c      *Client
	gw     gatewayv1.GatewayClient
	id     string
	stream gatewayv1.Gateway_ReadResultClient
	got    int64 // bytes of the result received
	skip   int64 // bytes of a reopened stream received already
	buf    []byte
	err    error
	acked  bool
}

// ack acknowledges the result, read whole, once.
func (r *resultReader) ack() {
	if !r.acked {
		r.acked = true
		r.c.ackSoon(r.ctx, r.id)
	}
}

// open (re)opens the stream, retrying while the gateway is unavailable,
// to skip what was received already.
func (r *resultReader) open() error {
	return r.c.retried(r.ctx, "read result", func(ctx context.Context) (err error) {
		r.stream, err = r.gw.ReadResult(ctx, &gatewayv1.SessionRef{Namespace: r.c.Namespace, Id: r.id})
		r.skip = r.got
		return err
	})
}

func (r *resultReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		chunk, err := r.stream.Recv()
		switch {
		case err == io.EOF:
			r.err = io.EOF
			r.ack()
		case status.Code(err) == codes.Unavailable && r.ctx.Err() == nil:
			// Broken mid-stream: the result stays readable until
			// acknowledged, so read it again from where it broke.
			if oerr := r.open(); oerr != nil {
				r.err = gatewayError(r.ctx, "read result", oerr)
			}
		case err != nil:
			r.err = gatewayError(r.ctx, "read result", err)
		default:
			data := chunk.GetData()
			if r.skip > 0 {
				n := min(r.skip, int64(len(data)))
				data, r.skip = data[n:], r.skip-n
			}
			r.buf = data
			r.got += int64(len(data))
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *resultReader) Close() error {
	r.cancel()
	return nil
}

// readAll reads a streamed result into memory.
func (c *Client) readAll(ctx context.Context, id string, size int64) ([]byte, error) {
	rd, err := c.OpenResult(ctx, id)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	out := make([]byte, size)
	if _, err := io.ReadFull(rd, out); err != nil {
		return nil, &ziptrail.Error{Kind: ziptrail.KindUnavailable, Op: "read result", Err: fmt.Errorf("session %s: %w", id, err)}
	}
	rd.(*resultReader).ack()
	return out, nil
}

// RunSession starts a session and waits for its result; see StartSession
// and Wait. Use StartSession, Watch and Wait to follow its progress.
func (c *Client) RunSession(ctx context.Context, workflow string, input []byte) (*Result, error) {
	s, err := c.StartSession(ctx, workflow, input)
	if err != nil {
		return nil, err
	}
	return c.Wait(ctx, s.ID)
}

func session(p *gatewayv1.Session) *Session {
	s := &Session{ID: p.GetId(), Namespace: p.GetNamespace(), Workflow: p.GetWorkflow(), State: p.GetState(),
		Started: time.UnixMilli(p.GetStartedUnixMs()), Invocations: int(p.GetInvocations()), Objects: int(p.GetObjects()),
		Error: p.GetError(), ResultBucket: p.GetResultBucket(), ResultKey: p.GetResultKey(), ResultSize: p.GetResultSize()}
	if p.GetEndedUnixMs() != 0 {
		s.Ended = time.UnixMilli(p.GetEndedUnixMs())
	}
	return s
}

var gatewayKinds = map[codes.Code]ziptrail.Kind{
	codes.NotFound:           ziptrail.KindNotFound,
	codes.FailedPrecondition: ziptrail.KindUnavailable, // the workflow is not ready yet
	codes.ResourceExhausted:  ziptrail.KindTooLarge,
	codes.InvalidArgument:    ziptrail.KindInvalid,
	codes.Unavailable:        ziptrail.KindUnavailable,
	// No valid credentials, or not allowed (the message says which, and
	// the role to bind), as the admin client classifies the API server's
	// 401 and 403.
	codes.Unauthenticated:  ziptrail.KindUnavailable,
	codes.PermissionDenied: ziptrail.KindUnavailable,
	codes.DeadlineExceeded: ziptrail.KindTimeout,
	codes.Canceled:         ziptrail.KindTimeout,
}

// gatewayError classifies a gateway call's error by its gRPC code.
func gatewayError(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return &ziptrail.Error{Kind: ziptrail.KindTimeout, Op: op, Err: fmt.Errorf("%w (%s)", ctx.Err(), status.Convert(err).Message())}
	}
	st := status.Convert(err)
	kind, ok := gatewayKinds[st.Code()]
	if !ok {
		kind = ziptrail.KindInternal
	}
	return &ziptrail.Error{Kind: kind, Op: op, Err: errors.New(st.Message())}
}
