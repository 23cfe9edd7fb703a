// Package dispatch turns the trigger engine's invoke decisions into HTTP
// requests to the functions' Knative URLs, so Knative's activator and
// autoscaler stay in charge of where and when they run. Concurrency is
// bounded. Every request carries its invocation's idempotency key; only
// what is safe is retried, with backoff (call.RetryReason): what provably
// did not reach the function, Knative's transient statuses from before it,
// and — to a service whose sidecar answered with the key before, so
// honours it — a delivery whose answer was lost. A timed-out call and a
// function that answers with an error are reported, not retried:
// re-execution is the engine's decision, under a new key. Every request
// also carries its engine owner's fence (Options.Fence); a sidecar's
// refusal of a superseded owner's invocation is reported as
// ErrStaleOwner, not retried. Invocations waiting for a worker
// are bounded in number and bytes: past that, an invocation fails at once
// with ErrQueueFull (reported like any failure, so its session learns)
// instead of piling up in memory.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
)

// Resolver finds the URL of a namespace's Knative Service.
type Resolver interface {
	URL(ctx context.Context, namespace, service string) (*url.URL, error)
}

// Result is the outcome of one invocation.
type Result = call.Result

// Options configure a Dispatcher.
type Options struct {
	Resolver    Resolver
	Client      *http.Client
	Ingress     string        // host:port to dial for every request (Knative ingress); empty dials the URL's host
	Concurrency int           // requests in flight at most; default 64
	Queue       int           // invocations waiting for a worker at most; default 65536
	QueueBytes  int64         // their (estimated) bytes at most; default 256 MiB
	MaxTries    int           // attempts per invocation for failures safe to retry; default 5
	BaseBackoff time.Duration // first retry delay; default 50ms, doubled each try
	MaxBackoff  time.Duration // default 5s
	MaxBody     int64         // response bytes kept; default 1 MiB
	// ProducerNode, when set, names the node of the pod that produced the
	// envelope's largest referenced object ("" when unknown); each request
	// then carries it as invocation.HeaderProducerNode, which
	// activator-ext's locality preference reads. It is called for every
	// try and must be safe for concurrent use.
	ProducerNode func(env *invocation.Envelope) string
	// OnResult is called once per invocation: from a worker goroutine, or
	// from SubmitWait's caller for an invocation refused at submission.
	OnResult func(Result)
	// Fence, when set, is the fence of the engine owner that dispatches
	// env ("" for none): the request carries it as
	// invocation.HeaderOwnerFence, and a receiving sidecar that saw a
	// newer owner of the checkpoint refuses it (Result.Err matches
	// ErrStaleOwner; not retried). It is called for every invocation and
	// must be safe for concurrent use.
	Fence func(env *invocation.Envelope) string
	// Router, when set, picks a ready pod of the function's revision for
	// each invocation, which then goes straight to that pod's
	// queue-proxy instead of through the ingress and the activator
	// (package direct; call.Options.Router says when the route takes it
	// after all).
	Router call.Router
}

// ErrStaleOwner matches a receiving sidecar's refusal of an invocation
// whose owner fence is older than one it saw (call.StaleOwnerError): the
// function did not run; the engine that dispatched it is superseded.
var ErrStaleOwner = call.ErrStaleOwner

// StaleOwnerError is such a refusal, with the fences.
type StaleOwnerError = call.StaleOwnerError

// Dispatcher sends invocations from a bounded pool of workers.
type Dispatcher struct {
	opts Options
	call call.Options // how one invocation is sent (package call)
	wg   sync.WaitGroup

	mu     sync.Mutex
	queue  []*invocation.Envelope // waiting for a worker, oldest first
	queued int64                  // their estimated bytes
	wake   chan struct{}          // signalled when the queue may have work
	// drain is closed by Drain: workers take nothing more (drain.go).
	drain     chan struct{}
	drainOnce sync.Once
}

// ErrQueueFull means the dispatcher is saturated: the functions do not keep
// up with the invocations; the caller should retry later.
var ErrQueueFull = errors.New("dispatch: queue full")

// New returns a dispatcher; Start runs its workers.
func New(opts Options) (*Dispatcher, error) {
	if opts.Resolver == nil {
		return nil, errors.New("dispatch: a Resolver is required")
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: 15 * time.Minute}
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 64
	}
	if opts.Queue <= 0 {
		opts.Queue = 1 << 16
	}
	if opts.QueueBytes <= 0 {
		opts.QueueBytes = 256 << 20
	}
	if opts.MaxTries <= 0 {
		opts.MaxTries = 5
	}
	if opts.BaseBackoff <= 0 {
		opts.BaseBackoff = 50 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 5 * time.Second
	}
	if opts.MaxBody <= 0 {
		opts.MaxBody = 1 << 20
	}
	// Requests straight to pods dial the pod, whatever Ingress says.
	direct := opts.Client
	if opts.Router != nil {
		base, _ := opts.Client.Transport.(*http.Transport)
		c := *opts.Client
		c.Transport = call.DirectTransport(base, opts.Concurrency)
		direct = &c
	}
	// The route's requests: connections kept per function host (as many
	// as workers) and MaxIdleConns in all, not http.DefaultTransport's 2
	// and 100, which made steps dial anew under load or across more than
	// 100 functions.
	if base, ok := opts.Client.Transport.(*http.Transport); ok || opts.Client.Transport == nil {
		if base == nil {
			base = http.DefaultTransport.(*http.Transport)
		}
		tr := base.Clone()
		if opts.Ingress != "" {
			// Dial the ingress whatever the URL's host; the Host header routes.
			ingress := opts.Ingress
			dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
			tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, network, ingress)
			}
		}
		tr.MaxIdleConnsPerHost = opts.Concurrency
		tr.MaxIdleConns = call.MaxIdleConns
		c := *opts.Client
		c.Transport = tr
		opts.Client = &c
	}
	d := &Dispatcher{opts: opts, wake: make(chan struct{}, 1), drain: make(chan struct{})}
	d.call = call.Options{Client: opts.Client, MaxTries: opts.MaxTries, BaseBackoff: opts.BaseBackoff, MaxBackoff: opts.MaxBackoff,
		MaxBody: opts.MaxBody, ProducerNode: opts.ProducerNode, Receivers: &call.Receivers{}, Fence: opts.Fence,
		// The orchestrator releases the report each answer names, once a
		// save holds the answer (orchestrator/acks.go).
		KeepReport:   true,
		Router:       opts.Router,
		DirectClient: direct,
		OnRetry:      func(reason string) { retries.WithLabelValues(reason).Inc() },
		OnRoute:      func(route string) { routes.WithLabelValues(route).Inc() },
		URL: func(ctx context.Context, env *invocation.Envelope) (string, error) {
			u, err := opts.Resolver.URL(ctx, env.Namespace, env.Function)
			if err != nil {
				return "", err
			}
			return u.String(), nil
		}}
	d.call.Defaults()
	return d, nil
}

// Start runs the workers until ctx ends; Wait blocks until they have exited.
func (d *Dispatcher) Start(ctx context.Context) {
	for i := 0; i < d.opts.Concurrency; i++ {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for ctx.Err() == nil && !d.isDraining() {
				env := d.next()
				if env == nil {
					select {
					case <-ctx.Done():
					case <-d.wake:
					case <-d.drain:
					}
					continue
				}
				inflight.Inc()
				res := d.send(ctx, env)
				inflight.Dec()
				observe(res)
				if d.opts.OnResult != nil {
					d.opts.OnResult(res)
				}
			}
		}()
	}
}

// Wait blocks until every worker has stopped.
func (d *Dispatcher) Wait() { d.wg.Wait() }

// SubmitWait hands an invocation over for good: it waits for the verdict,
// never for a worker, and never drops the invocation silently. An invalid
// envelope, or one that does not fit the queue (Options.Queue and
// QueueBytes), fails at once: OnResult receives it with the error (Tries
// 0), on the caller's goroutine, so its session learns; SubmitWait returns
// the error too. Once ctx has ended (shutdown) nothing is queued or
// reported and ctx's error is returned.
func (d *Dispatcher) SubmitWait(ctx context.Context, env *invocation.Envelope) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := d.Submit(env)
	if err != nil && d.opts.OnResult != nil {
		res := Result{Envelope: env, Err: err}
		observe(res)
		d.opts.OnResult(res)
	}
	return err
}

// Submit queues an invocation without blocking; when it is invalid or the
// queue is full it returns the error and the invocation stays the caller's.
func (d *Dispatcher) Submit(env *invocation.Envelope) error {
	if err := env.Validate(); err != nil {
		return err
	}
	size := envelopeBytes(env)
	d.mu.Lock()
	if len(d.queue) >= d.opts.Queue || d.queued+size > d.opts.QueueBytes {
		n, b := len(d.queue), d.queued
		d.mu.Unlock()
		queueFull.Inc()
		return fmt.Errorf("%w: %d invocations (%d bytes) wait for the functions already, limits %d and %d bytes; "+
			"the functions are not keeping up: retry later, or raise their concurrency or scale", ErrQueueFull, n, b, d.opts.Queue, d.opts.QueueBytes)
	}
	d.queue = append(d.queue, env)
	d.queued += size
	queued.Set(float64(len(d.queue)))
	d.mu.Unlock()
	d.signal()
	return nil
}

// next takes the oldest queued invocation, nil when there is none; it
// passes the wake-up on while work remains, for the other workers.
func (d *Dispatcher) next() *invocation.Envelope {
	d.mu.Lock()
	if len(d.queue) == 0 {
		d.mu.Unlock()
		return nil
	}
	env := d.queue[0]
	d.queue[0] = nil
	d.queue = d.queue[1:]
	d.queued -= envelopeBytes(env)
	more := len(d.queue) > 0
	queued.Set(float64(len(d.queue)))
	d.mu.Unlock()
	if more {
		d.signal()
	}
	return env
}

func (d *Dispatcher) signal() {
	select {
	case d.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// envelopeBytes estimates what a queued envelope holds in memory.
func envelopeBytes(env *invocation.Envelope) int64 {
	n := 256 + len(env.Namespace) + len(env.Workflow) + len(env.Function) + len(env.Session) + len(env.Invocation) +
		len(env.Trigger) + len(env.Group) + len(env.Args)
	for _, o := range env.Objects {
		n += 128 + len(o.Bucket) + len(o.Key) + len(o.Ref) + len(o.Path) + len(o.Inline)
		for k, v := range o.Metadata {
			n += 32 + len(k) + len(v)
		}
	}
	return int64(n)
}

func (d *Dispatcher) send(ctx context.Context, env *invocation.Envelope) Result {
	return call.Send(ctx, &d.call, env)
}
