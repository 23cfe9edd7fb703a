package orchestrator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// KeySource gives a namespace's reference keys (control.SecretKeys, which
// the control stream hands to the namespace's sidecars).
type KeySource interface {
	Keys(ctx context.Context, namespace string) (*controlv1.Keys, error)
}

// keyrings keeps one keyring and one data-plane client per namespace,
// following the namespace's key rotation.
type keyrings struct {
	src KeySource
	mu  sync.Mutex
	m   map[string]*nsKeys
}

type nsKeys struct {
	from   *controlv1.Keys // what the keyring was built from
	kr     *ref.Keyring
	client *pull.Client
}

// get returns the namespace's keyring and client, refreshed when its keys
// changed.
func (k *keyrings) get(ctx context.Context, namespace string) (*nsKeys, error) {
	if k == nil || k.src == nil {
		return nil, errors.New("this operator has no reference keys (orchestrator Options.Keys)")
	}
	keys, err := k.src.Keys(ctx, namespace)
	if err != nil {
		return nil, fmt.Errorf("reference keys of namespace %s: %w", namespace, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]*nsKeys{}
	}
	nk := k.m[namespace]
	if nk != nil && nk.from == keys {
		return nk, nil
	}
	secrets := make(map[string][]byte, len(keys.Keys))
	for _, key := range keys.Keys {
		secrets[key.Id] = key.Secret
	}
	if nk != nil {
		if err := nk.kr.Set(secrets, keys.ActiveKeyId); err != nil {
			return nil, err
		}
		nk.from = keys
		return nk, nil
	}
	kr, err := ref.NewKeyring(namespace, secrets, keys.ActiveKeyId)
	if err != nil {
		return nil, fmt.Errorf("reference keys of namespace %s: %w", namespace, err)
	}
	nk = &nsKeys{from: keys, kr: kr, client: &pull.Client{Keys: kr}}
	k.m[namespace] = nk
	return nk, nil
}

// open opens a reference of any namespace known here.
func (k *keyrings) open(r string, now time.Time) (ref.Record, error) {
	k.mu.Lock()
	krs := make([]*ref.Keyring, 0, len(k.m))
	for _, nk := range k.m {
		krs = append(krs, nk.kr)
	}
	k.mu.Unlock()
	err := fmt.Errorf("%w: no namespace's keys here", ref.ErrUnknownKey)
	for _, kr := range krs {
		rec, oerr := kr.Open(r, now)
		if oerr == nil {
			return rec, nil
		}
		if !errors.Is(oerr, ref.ErrUnknownKey) {
			err = oerr // the namespace whose key id matched says why
		}
	}
	return ref.Record{}, err
}

func (k *keyrings) close() {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, nk := range k.m {
		nk.client.Close()
	}
}

// Results returns the gateway's ResultReader: inline results directly,
// results held by reference pulled from their producer's pod through the
// data plane and streamed.
func (o *Orchestrator) Results() Results { return Results{o: o} }

// DefaultResultGrace is how long a result stays readable after its first
// full read when its client does not acknowledge it (Options.ResultGrace).
const DefaultResultGrace = 5 * time.Minute

// Results implements gateway.ResultReader. The zero Results reads inline
// results only; Orchestrator.Results reads every result.
type Results struct{ o *Orchestrator }

// OpenResult implements gateway.ResultReader. A result held by reference
// streams from the producer as the caller reads: the pull writes each
// chunk, in order, into a pipe the caller drains, so at most the pull's
// window of chunks is in memory whatever the result's size. Reading it
// frees nothing: the session's objects stay until the client acknowledges
// the result, or until ResultGrace after the gateway handed it whole to a
// client (ResultDelivered), or ResultHold when that never happens (see
// holdResult).
func (r Results) OpenResult(ctx context.Context, namespace string, res *sessions.Result) (io.ReadCloser, error) {
	if res == nil {
		return nil, errors.New("no result object")
	}
	if res.Ref == "" {
		return io.NopCloser(bytes.NewReader(res.Inline)), nil
	}
	if r.o == nil {
		return nil, fmt.Errorf("result %s/%s is held by reference: read it with Orchestrator.Results, which pulls it", res.Bucket, res.Key)
	}
	nk, err := r.o.keys.get(ctx, namespace)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	started := make(chan error, 1)
	go func() {
		defer cancel()
		var once sync.Once
		_, err := nk.client.PullTo(ctx, res.Ref, func(size int64) (io.WriterAt, error) {
			if size != res.Size && res.Size > 0 {
				return nil, fmt.Errorf("the producer holds %d bytes, the session recorded %d", size, res.Size)
			}
			once.Do(func() { started <- nil })
			return &sequential{w: pw}, nil
		})
		once.Do(func() { started <- err })
		_ = pw.CloseWithError(err)
	}()
	if err := <-started; err != nil {
		_ = pr.Close()
		return nil, resultErr(err)
	}
	return &pipeReader{PipeReader: pr, cancel: cancel}, nil
}

// resultErr marks the errors that mean the result is gone for good.
func resultErr(err error) error {
	for _, gone := range []error{pull.ErrNotFound, pull.ErrExhausted, pull.ErrExpired, ref.ErrExpired} {
		if errors.Is(err, gone) {
			return fmt.Errorf("%w: %v", gateway.ErrResultGone, err)
		}
	}
	return err
}

// pipeReader stops the pull when the caller closes early.
type pipeReader struct {
	*io.PipeReader
	cancel context.CancelFunc
}

func (p *pipeReader) Close() error {
	p.cancel()
	return p.PipeReader.Close()
}

// sequential adapts a stream to the pull's WriterAt: the pull writes its
// chunks in order, so each must start where the last ended.
type sequential struct {
	w   io.Writer
	off int64
}

func (s *sequential) WriteAt(p []byte, off int64) (int, error) {
	if off != s.off {
		return 0, fmt.Errorf("out-of-order chunk at %d, expected %d", off, s.off)
	}
	n, err := s.w.Write(p)
	s.off += int64(n)
	return n, err
}

// ResultDelivered implements gateway.ResultAcker: the gateway handed the
// whole result to a client's connection. The first full read starts the
// grace (ResultGrace) after which the session's objects are freed unless
// the client acknowledged the result before; a read cut short never gets
// here, so it frees nothing and starts nothing.
func (r Results) ResultDelivered(namespace string, res *sessions.Result) {
	if r.o != nil && res != nil && res.Ref != "" {
		r.o.resultRead(res.Ref)
	}
}

// AckResult implements gateway.ResultAcker: the client has the result, so
// its session's objects are freed now. Acknowledging a result that is not
// held (inline, freed already, or unknown here) does nothing.
func (r Results) AckResult(namespace string, res *sessions.Result) {
	if r.o != nil && res != nil && res.Ref != "" {
		r.o.resultAcked(res.Ref)
	}
}

// ResultDelivered forwards to the orchestrator that holds the result.
func (sr shardedResults) ResultDelivered(namespace string, res *sessions.Result) {
	if o := sr.holder(res); o != nil {
		o.Results().ResultDelivered(namespace, res)
	}
}

// AckResult forwards to the orchestrator that holds the result.
func (sr shardedResults) AckResult(namespace string, res *sessions.Result) {
	if o := sr.holder(res); o != nil {
		o.Results().AckResult(namespace, res)
	}
}

func (sr shardedResults) holder(res *sessions.Result) *Orchestrator {
	if res == nil || res.Ref == "" {
		return nil
	}
	for _, o := range sr.s.orchestrators() {
		if o.holds(res.Ref) {
			return o
		}
	}
	return nil
}

var resultsReleased = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ziptrail_results_released_total",
	Help: "Completed sessions' results held by reference whose objects were released, by why: ack (the client acknowledged it), grace (ResultGrace passed after its first full read), unread (ResultHold passed without a full read), stop (the orchestrator stopped).",
}, []string{"reason"})

func init() { metrics.Registry.MustRegister(resultsReleased) }

// heldResult is a completed session whose result lives in a pod by
// reference: the session's objects are not dropped at its end (the drop
// would free the result too) but once the client acknowledged the result,
// or ResultGrace after its first full read, or when ResultHold passes
// without one.
type heldResult struct {
	namespace, session, ref string
	until                   time.Time // ResultHold after the session completed, then ResultGrace after the first full read
	read                    bool      // read whole once: until is the grace's end
	dropDue                 bool      // the engine asked to drop the session's objects
}

// resultGrace is Options.ResultGrace or its default.
func (o *Orchestrator) resultGrace() time.Duration {
	if o.opts.ResultGrace > 0 {
		return o.opts.ResultGrace
	}
	return DefaultResultGrace
}

// holdResult keeps a completed session's objects while its result, held
// by reference, has not been acknowledged.
func (o *Orchestrator) holdResult(workflow, session string, res *sessions.Result) {
	if res == nil || res.Ref == "" {
		return
	}
	if s, err := o.sessions.Get(session); err != nil || s.Result == nil || s.Result.Ref != res.Ref {
		return // the session had ended otherwise; this result is not its
	}
	ns, _, _ := strings.Cut(workflow, "/")
	o.heldMu.Lock()
	o.held[session] = &heldResult{namespace: ns, session: session, ref: res.Ref, until: o.opts.Now().Add(o.opts.ResultHold)}
	o.heldRefs[res.Ref] = session
	o.heldMu.Unlock()
}

// dropPending reports whether a session's objects must wait for its result
// to be acknowledged, noting that they are due.
func (o *Orchestrator) dropPending(session string) bool {
	o.heldMu.Lock()
	defer o.heldMu.Unlock()
	h, ok := o.held[session]
	if ok {
		h.dropDue = true
	}
	return ok
}

// resultRead starts a held result's grace at its first full read.
func (o *Orchestrator) resultRead(ref string) {
	o.heldMu.Lock()
	defer o.heldMu.Unlock()
	if h, ok := o.held[o.heldRefs[ref]]; ok && !h.read {
		h.read, h.until = true, o.opts.Now().Add(o.resultGrace())
	}
}

// resultAcked releases a session's objects once its client acknowledged
// its result.
func (o *Orchestrator) resultAcked(ref string) {
	o.heldMu.Lock()
	h, ok := o.held[o.heldRefs[ref]]
	if ok {
		delete(o.held, h.session)
		delete(o.heldRefs, ref)
	}
	o.heldMu.Unlock()
	if ok {
		resultsReleased.WithLabelValues("ack").Inc()
		if h.dropDue {
			o.dropObjects(h.namespace, h.session)
		}
	}
}

// releaseResults drops the objects of sessions whose result was neither
// acknowledged nor read within ResultHold, or read whole more than
// ResultGrace ago (all of them when all is set).
func (o *Orchestrator) releaseResults(all bool) {
	now := o.opts.Now()
	var due []*heldResult
	o.heldMu.Lock()
	for s, h := range o.held {
		if all || !now.Before(h.until) {
			due = append(due, h)
			delete(o.held, s)
			delete(o.heldRefs, h.ref)
		}
	}
	o.heldMu.Unlock()
	for _, h := range due {
		reason := "unread"
		switch {
		case all:
			reason = "stop"
		case h.read:
			reason = "grace"
		}
		resultsReleased.WithLabelValues(reason).Inc()
		if h.dropDue {
			o.dropObjects(h.namespace, h.session)
		}
	}
}

// dropObjects tells the namespace's sidecars to free a session's objects.
func (o *Orchestrator) dropObjects(namespace, session string) {
	if o.opts.Control == nil {
		return
	}
	if err := o.opts.Control.Drop(namespace, session, nil); err != nil {
		o.opts.Log.Error(err, "drop session objects", "session", session)
	}
}

// dropInput frees a session's input held in the input store.
func (o *Orchestrator) dropInput(session string) {
	if o.opts.Inputs != nil {
		o.opts.Inputs.Drop(session)
	}
}

// ReleaseResults frees now what is due (Run does it every minute).
func (o *Orchestrator) ReleaseResults() { o.releaseResults(false) }
