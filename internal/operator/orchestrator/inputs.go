package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
)

// DefaultInlineInput is the largest session input that travels inline in
// the invocation (and in the engine's checkpoints); larger ones are held in
// the operator's input store and travel by reference, as the sidecars'
// objects do.
const DefaultInlineInput = 64 << 10

// InputsOptions configure an Inputs store.
type InputsOptions struct {
	// Keys seal the references, with the key of the session's namespace.
	Keys KeySource
	// Addr is the data-plane address pods reach the store at (host:port of
	// the listener Serve is given, as seen from the pods).
	Addr string
	// Cap bounds the bytes held for all running sessions together; a start
	// that does not fit is refused (gateway.ErrInputsFull). Default 256 MiB.
	Cap int64
	// PerNamespace bounds the bytes held for one namespace's sessions
	// (Limits.InputBytesPerNamespace): a start beyond it is refused with a
	// *gateway.LimitError (429), so one namespace cannot take the whole
	// Cap. Zero: Cap only.
	PerNamespace int64
	// MaxAge bounds how long an input is held when its session never ends
	// here (e.g. the operator lost leadership); default 1h.
	MaxAge time.Duration
	Now    func() time.Time
}

// Inputs holds large session inputs in the operator's memory and serves
// them on the data plane: the first function's sidecar pulls its input by
// reference like any other object. Inputs are held until their session
// ends, within a fixed memory budget.
type Inputs struct {
	opts   InputsOptions
	keys   *keyrings
	store  *store.Store
	server *pull.Server

	mu   sync.Mutex
	used int64                // reserved by starts in progress + held
	held map[string]heldInput // session -> its input
	byNS map[string]int64     // used, per namespace
}

type heldInput struct {
	id, namespace string
	size          int64
	expires       time.Time
}

// NewInputs returns an input store; Serve serves it.
func NewInputs(opts InputsOptions) *Inputs {
	if opts.Cap <= 0 {
		opts.Cap = 256 << 20
	}
	if opts.MaxAge <= 0 {
		opts.MaxAge = time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	in := &Inputs{opts: opts, keys: &keyrings{src: opts.Keys}, store: store.New(opts.Cap, opts.Now), held: map[string]heldInput{}, byNS: map[string]int64{}}
	in.server = &pull.Server{Store: in.store, Now: opts.Now, OpenRef: in.open}
	return in
}

// Serve serves the data plane on ln until Close.
func (in *Inputs) Serve(ln net.Listener) error { return in.server.Serve(ln) }

// Close stops serving.
func (in *Inputs) Close() error { return in.server.Close() }

// Used is the bytes held or being received.
func (in *Inputs) Used() int64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.used
}

// open opens a reference to a held input: sealed with the key of the
// namespace whose session it belongs to, and naming only that namespace's
// objects (a sidecar holds its namespace's keys and could seal a reference
// to any id).
func (in *Inputs) open(r string, now time.Time) (ref.Record, error) {
	rec, err := in.keys.open(r, now)
	if err != nil {
		return rec, err
	}
	if !strings.HasPrefix(rec.Key, rec.Namespace+"/") {
		return ref.Record{}, fmt.Errorf("%w: %s is not an input of namespace %s", ref.ErrForeign, rec.Key, rec.Namespace)
	}
	return rec, nil
}

// hold reads a session's input of size bytes into the store and returns
// the object referencing it. The memory is reserved before anything is
// read, so concurrent large starts cannot together exceed the cap.
func (in *Inputs) hold(ctx context.Context, namespace, session string, r io.Reader, size int64) (engine.Object, error) {
	if size > in.opts.Cap {
		return engine.Object{}, fmt.Errorf("%w: %d bytes, more than the %d bytes the operator reserves for session inputs (--input-store-bytes)", gateway.ErrInputTooLarge, size, in.opts.Cap)
	}
	nk, err := in.keys.get(ctx, namespace)
	if err != nil {
		return engine.Object{}, err
	}
	if err := in.reserve(namespace, size); err != nil {
		return engine.Object{}, err
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		in.unreserve(namespace, size)
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			err = fmt.Errorf("the input ended before its announced %d bytes: %w", size, err)
		}
		return engine.Object{}, fmt.Errorf("read input: %w", err)
	}
	id := namespace + "/" + session + "/input"
	exp := in.opts.Now().Add(in.opts.MaxAge)
	meta := store.Meta{ID: id, Session: session, Bucket: "input", Key: "input", Reads: math.MaxUint32, Expires: exp}
	if err := in.store.Put(ctx, meta, data); err != nil {
		in.unreserve(namespace, size)
		return engine.Object{}, err
	}
	rf, err := nk.kr.Seal(ref.Record{Addr: in.opts.Addr, Key: id, Expires: exp, Reads: math.MaxUint32})
	if err != nil {
		in.store.Remove(id)
		in.unreserve(namespace, size)
		return engine.Object{}, err
	}
	in.mu.Lock()
	in.held[session] = heldInput{id: id, namespace: namespace, size: size, expires: exp}
	in.mu.Unlock()
	return engine.Object{Bucket: "input", Key: "input", Size: size, Ref: rf}, nil
}

func (in *Inputs) reserve(namespace string, n int64) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	now := in.opts.Now()
	for s, h := range in.held {
		if !now.Before(h.expires) {
			in.dropLocked(s, h)
		}
	}
	if max, have := in.opts.PerNamespace, in.byNS[namespace]; max > 0 && have+n > max {
		return &gateway.LimitError{Limit: gateway.LimitInputBytesPerNamespace, Namespace: namespace, RetryAfter: 5 * time.Second,
			Msg: fmt.Sprintf("namespace %s holds %d bytes of session inputs in the operator's input store and this input needs %d more, "+
				"the limit %s is %d: retry when its sessions finish, or put large data into a bucket", namespace, have, n, gateway.LimitInputBytesPerNamespace, max)}
	}
	if in.used+n > in.opts.Cap {
		return fmt.Errorf("%w: %d bytes of %d held for running sessions, this input needs %d; retry when sessions finish, or raise --input-store-bytes",
			gateway.ErrInputsFull, in.used, in.opts.Cap, n)
	}
	in.used += n
	in.byNS[namespace] += n
	return nil
}

func (in *Inputs) unreserve(namespace string, n int64) {
	in.mu.Lock()
	in.used -= n
	in.less(namespace, n)
	in.mu.Unlock()
}

// less takes n from namespace's bytes (under in.mu).
func (in *Inputs) less(namespace string, n int64) {
	if in.byNS[namespace] -= n; in.byNS[namespace] <= 0 {
		delete(in.byNS, namespace)
	}
}

// UsedBy is the bytes held or being received for namespace's sessions.
func (in *Inputs) UsedBy(namespace string) int64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.byNS[namespace]
}

// Drop frees a session's input (its session ended).
func (in *Inputs) Drop(session string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if h, ok := in.held[session]; ok {
		in.dropLocked(session, h)
	}
}

func (in *Inputs) dropLocked(session string, h heldInput) {
	in.store.Remove(h.id)
	in.used -= h.size
	in.less(h.namespace, h.size)
	delete(in.held, session)
}

// readInput reads a session's input: small ones inline, larger ones into
// the input store (by reference), refused when there is none or it is full.
func (o *Orchestrator) readInput(ctx context.Context, namespace, session string, r io.Reader, size int64) (engine.Object, error) {
	limit := o.opts.InlineInput
	if size < 0 {
		// Unknown length: fine while it stays small.
		data, err := io.ReadAll(io.LimitReader(r, limit+1))
		if err != nil {
			return engine.Object{}, fmt.Errorf("read input: %w", err)
		}
		if int64(len(data)) > limit {
			if o.opts.Inputs == nil {
				return engine.Object{}, o.noInputStore()
			}
			return engine.Object{}, fmt.Errorf("%w: inputs over %d bytes must announce their length (Content-Length)", gateway.ErrLengthRequired, limit)
		}
		return engine.Object{Bucket: "input", Key: "input", Inline: data, Size: int64(len(data))}, nil
	}
	if size <= limit {
		data := make([]byte, size)
		if _, err := io.ReadFull(r, data); err != nil {
			return engine.Object{}, fmt.Errorf("read input: %w", err)
		}
		return engine.Object{Bucket: "input", Key: "input", Inline: data, Size: size}, nil
	}
	if o.opts.Inputs == nil {
		return engine.Object{}, o.noInputStore()
	}
	return o.opts.Inputs.hold(ctx, namespace, session, r, size)
}

func (o *Orchestrator) noInputStore() error {
	return fmt.Errorf("%w: inputs over %d bytes are held in the operator's input store, and this operator runs none", gateway.ErrInputTooLarge, o.opts.InlineInput)
}
