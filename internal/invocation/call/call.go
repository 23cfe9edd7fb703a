// Package call sends one invocation to a function over HTTP: the envelope
// as body, the headers every invocation carries, retries with backoff for
// the platform's transient failures, the response read up to a bound. The
// operator's dispatcher (package dispatch) and the producer's sidecar,
// when it fires a delegated trigger itself (docs/control-stream.md), send
// invocations with it, so both send exactly the same requests. It imports
// no Kubernetes package: queue-proxy-zl links it.
package call

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Result is the outcome of one invocation.
type Result struct {
	Envelope *invocation.Envelope
	Status   int // HTTP status, 0 when no response arrived
	Header   http.Header
	Body     []byte // the function's response (bounded)
	Err      error
	Tries    int
	Latency  time.Duration
}

// Options configure Send; zero values take the defaults.
type Options struct {
	Client      *http.Client
	MaxTries    int           // attempts for failures that are safe to retry; default 5
	BaseBackoff time.Duration // first retry delay; default 50ms, doubled each try
	MaxBackoff  time.Duration // default 5s
	MaxBody     int64         // response bytes kept; default 1 MiB
	// URL returns where to send the invocation, asked on every try.
	URL func(ctx context.Context, env *invocation.Envelope) (string, error)
	// ProducerNode, when set, names the node of the envelope's producer
	// for invocation.HeaderProducerNode ("" when unknown), on every try.
	ProducerNode func(env *invocation.Envelope) string
	// Wrote, when set, is called once the first try's request was written
	// whole (the function may run from then on), or with false when that
	// try failed before.
	Wrote func(bool)
	// OnRetry, when set, is called before every retry with its reason
	// (see RetryReason).
	OnRetry func(reason string)
	// Receivers, when set, learns which services answer with their
	// idempotency key (their sidecars honour it): a failure after the
	// request was written is retried only for those.
	Receivers *Receivers
	// Fence, when set, is the fence of the engine owner that sends env
	// (invocation.HeaderOwnerFence; "" for none), asked once per
	// invocation. The operator's dispatcher sets it; a sidecar firing a
	// delegated trigger does not (it is no owner). A receiving sidecar
	// that saw a newer owner of the fence's checkpoint refuses the
	// invocation: Result.Err is then a *StaleOwnerError.
	Fence func(env *invocation.Envelope) string
	// KeepReport asks the receiving sidecar to keep its report of the
	// outcome until the sender, having applied the answer, releases it
	// (invocation.HeaderKeepReport): the operator's dispatcher.
	KeepReport bool
	// Router, when set, picks a ready pod for each try, to which the
	// invocation goes straight (its queue-proxy's port, with
	// DirectClient) instead of by URL through Knative's ingress and
	// activator. A try the pod provably did not take (no connection;
	// 502, 503 or 429 from before the function: queue-proxy's overload)
	// goes by URL at once, in the same try; a lost answer is asked of
	// the same pod again, whose sidecar answers from its record.
	Router Router
	// DirectClient sends the Router's tries (default Client).
	DirectClient *http.Client
	// OnRoute, when set, is called for every request sent, with its
	// route: RouteDirect, RouteFallback (a pod's refusal, then by URL),
	// RouteURL.
	OnRoute func(route string)
}

// Routes a request takes (Options.OnRoute).
const (
	RouteDirect   = "direct"   // straight to the pod the Router picked
	RouteFallback = "fallback" // the picked pod did not take it: by URL at once
	RouteURL      = "url"      // by URL: Knative's ingress and activator
)

func (o *Options) onRoute(route string) {
	if o.OnRoute != nil {
		o.OnRoute(route)
	}
}

// Router picks where an invocation goes straight to, as Knative's
// activator picks a pod of a revision. It must be safe for concurrent use.
type Router interface {
	// Pick returns the address (host:port) of a ready pod of env's
	// service with room for one more request, preferring node (the
	// producer's, "" when unknown), and done, to be called once with
	// the try's verdict when the try ended; "" (and a nil done) sends
	// the invocation by its URL.
	Pick(env *invocation.Envelope, node string) (addr string, done func(Verdict))
}

// DirectDialTimeout bounds the dial of a try sent straight to a pod: a
// pod's address answers within a millisecond or not at all (a
// NetworkPolicy that drops the sender's packets, a pod gone without its
// address being reused), and the route is there to take the invocation.
const DirectDialTimeout = time.Second

// MaxIdleConns is how many idle connections a sender of invocations keeps
// in all (for IdleConnTimeout, 90 s): one or more per pod, or per
// function host through the ingress, that a step may go to next.
// http.DefaultTransport keeps 100, and evicts the least recently used:
// with more functions than that in a chain, each step's connection was
// the one evicted last, so every step dialed anew (measured with
// bench/chain's 100-function chain: a step's request took 2–3.4 ms from
// sent to answered against 0.6–1.2 ms for the same request to one warm
// function).
const MaxIdleConns = 4096

// DirectTransport is base (nil: http.DefaultTransport) for tries sent
// straight to pods: dials bounded by DirectDialTimeout, perHost idle
// connections kept per pod, MaxIdleConns in all.
func DirectTransport(base *http.Transport, perHost int) *http.Transport {
	if base == nil {
		base = http.DefaultTransport.(*http.Transport)
	}
	tr := base.Clone()
	dialer := &net.Dialer{Timeout: DirectDialTimeout, KeepAlive: 30 * time.Second}
	tr.DialContext = dialer.DialContext
	tr.MaxIdleConnsPerHost = perHost
	tr.MaxIdleConns = MaxIdleConns
	return tr
}

// Verdict is how a try sent straight to a pod ended, for its Router.
type Verdict int

const (
	Answered   Verdict = iota // the pod answered (whatever the function said)
	Unreached                 // no connection: the pod is gone or not listening
	Overloaded                // 502, 503 or 429 from before the function
	Lost                      // the request was written and its answer lost
)

// ErrStaleOwner matches a *StaleOwnerError.
var ErrStaleOwner = errors.New("refused as from a stale engine owner")

// StaleOwnerError is a receiving sidecar's refusal of an invocation sent
// under an owner fence older than one it saw for the same checkpoint key
// (409 with invocation.HeaderStaleOwner): the function did not run, and
// the engine owner that sent it is superseded. It is not retried.
type StaleOwnerError struct {
	Service string           // namespace/service
	Sent    invocation.Fence // the fence the invocation carried
	Seen    invocation.Fence // the newer one the sidecar saw
}

func (e *StaleOwnerError) Error() string {
	return fmt.Sprintf("function %s: its sidecar refused the invocation as from a stale engine owner: sent under owner fence %s, "+
		"the sidecar has seen %s (a newer owner of the checkpoint)", e.Service, e.Sent, e.Seen)
}

// Is makes errors.Is(err, ErrStaleOwner) hold.
func (e *StaleOwnerError) Is(target error) bool { return target == ErrStaleOwner }

// staleOwner reads a 409 answer to an invocation sent under fence: a
// *StaleOwnerError when it is a sidecar's refusal of that fence (its
// HeaderStaleOwner names a higher generation of the same checkpoint),
// else nil (the function's own 409, or a sidecar's refusal of a key).
func staleOwner(env *invocation.Envelope, fence string, status int, header http.Header) error {
	if fence == "" || status != http.StatusConflict || header == nil {
		return nil
	}
	v := header.Get(invocation.HeaderStaleOwner)
	if v == "" {
		return nil
	}
	sent, err1 := invocation.ParseFence(fence)
	seen, err2 := invocation.ParseFence(v)
	if err1 != nil || err2 != nil || seen.Key != sent.Key || seen.Generation <= sent.Generation {
		return nil
	}
	return &StaleOwnerError{Service: env.Namespace + "/" + env.Function, Sent: sent, Seen: seen}
}

// Receivers remembers the services (namespace/service) whose answers
// echoed the request's idempotency key: their sidecars answer a duplicate
// delivery from their record instead of running the function again. Safe
// for concurrent use; the zero value is ready.
type Receivers struct{ m sync.Map }

// Honours reports whether env's service answered with its key before.
func (r *Receivers) Honours(env *invocation.Envelope) bool {
	if r == nil {
		return false
	}
	_, ok := r.m.Load(env.Namespace + "/" + env.Function)
	return ok
}

// learn notes that env's service echoed its key.
func (r *Receivers) learn(env *invocation.Envelope, h http.Header) {
	if r == nil || h == nil || h.Get(invocation.HeaderIdempotencyKey) != env.Key() {
		return
	}
	k := env.Namespace + "/" + env.Function
	if _, ok := r.m.Load(k); !ok {
		r.m.Store(k, struct{}{})
	}
}

// Defaults fills the zero values of opts.
func (o *Options) Defaults() {
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 15 * time.Minute}
	}
	if o.MaxTries <= 0 {
		o.MaxTries = 5
	}
	if o.BaseBackoff <= 0 {
		o.BaseBackoff = 50 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 5 * time.Second
	}
	if o.MaxBody <= 0 {
		o.MaxBody = 1 << 20
	}
}

// Send sends env with its idempotency key, retrying only what is safe (see
// RetryReason): what provably did not reach the function, Knative's
// answers from before the function, and — to a service whose sidecar
// honours idempotency keys — a delivery whose answer was lost. A function
// that answers with an error, and a call that timed out, are reported in
// Err, not retried (re-execution is the engine's decision, under a new
// key). opts must have had Defaults applied.
func Send(ctx context.Context, opts *Options, env *invocation.Envelope) Result {
	start := time.Now()
	res := Result{Envelope: env}
	body, err := json.Marshal(env)
	if err != nil {
		res.Err = err
		if opts.Wrote != nil {
			opts.Wrote(false)
		}
		return res
	}
	fence := ""
	if opts.Fence != nil {
		if fence = opts.Fence(env); !validHeaderValue(fence) {
			fence = ""
		}
	}
	backoff := opts.BaseBackoff
	pin := "" // a pod whose answer was lost: its sidecar has the record
	for res.Tries = 1; ; res.Tries++ {
		tr := try(ctx, opts, env, body, fence, res.Tries == 1, &pin)
		res.Status, res.Header, res.Body, res.Err = tr.status, tr.header, tr.body, tr.err
		opts.Receivers.learn(env, tr.header)
		reason := RetryReason(env, tr.status, tr.header, tr.err, tr.written, opts.Receivers.Honours(env))
		if reason == "" || res.Tries >= opts.MaxTries || ctx.Err() != nil {
			break
		}
		if opts.OnRetry != nil {
			opts.OnRetry(reason)
		}
		// Full jitter keeps retries of a burst from arriving together.
		wait := time.Duration(rand.Int64N(int64(backoff)) + 1)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			res.Err = ctx.Err()
			res.Latency = time.Since(start)
			return res
		case <-t.C:
		}
		backoff = min(backoff*2, opts.MaxBackoff)
	}
	if res.Err == nil {
		res.Err = staleOwner(env, fence, res.Status, res.Header)
	}
	if res.Err == nil && (res.Status < 200 || res.Status > 299) {
		res.Err = fmt.Errorf("function %s/%s answered %d: %s", env.Namespace, env.Function, res.Status, strings.TrimSpace(string(res.Body)))
	}
	res.Latency = time.Since(start)
	return res
}

// tried is the outcome of one try.
type tried struct {
	status  int
	header  http.Header
	body    []byte
	err     error
	written bool // the request had a connection: it may have reached the function
}

// try sends env once: straight to a pod when opts.Router picks one (or
// to *pin, the pod of a lost answer), by URL when it does not or when
// the pod provably did not take it.
func try(ctx context.Context, opts *Options, env *invocation.Envelope, body []byte, fence string, first bool, pin *string) (t tried) {
	wrote := func(bool) {}
	if first && opts.Wrote != nil {
		once := false
		wrote = func(ok bool) {
			if !once {
				once = true
				opts.Wrote(ok)
			}
		}
	}
	node := ""
	if opts.ProducerNode != nil {
		if node = opts.ProducerNode(env); !validHeaderValue(node) {
			node = ""
		}
	}
	if opts.Router != nil {
		addr, done := *pin, func(Verdict) {}
		if addr == "" {
			addr, done = opts.Router.Pick(env, node)
		}
		if addr != "" {
			client := opts.DirectClient
			if client == nil {
				client = opts.Client
			}
			// A failure before the function is not the caller's to see:
			// the route is tried at once, and Wrote learns only of it.
			direct := func(ok bool) {
				if ok {
					wrote(true)
				}
			}
			t = attempt(ctx, opts, client, "http://"+addr+"/", env, body, fence, node, direct)
			if ctx.Err() != nil {
				// Cancelled (a stopping owner): nothing to learn of the
				// pod, nothing to send by the route.
				done(Answered)
				return t
			}
			v := verdict(env, t)
			done(v)
			switch v {
			case Answered:
				*pin = ""
				opts.onRoute(RouteDirect)
				return t
			case Lost:
				// Sent again, to the same pod: its sidecar answers
				// from its record or waits for the run.
				*pin = addr
				opts.onRoute(RouteDirect)
				return t
			}
			*pin = ""
			opts.onRoute(RouteFallback)
		}
	}
	u, err := opts.URL(ctx, env)
	if err != nil {
		wrote(false)
		t = tried{err: resolveError{fmt.Errorf("resolve %s/%s: %w", env.Namespace, env.Function, err)}}
		return t
	}
	opts.onRoute(RouteURL)
	return attempt(ctx, opts, opts.Client, u, env, body, fence, node, wrote)
}

// verdict reads a try sent straight to a pod.
func verdict(env *invocation.Envelope, t tried) Verdict {
	switch {
	case t.err != nil && !t.written:
		return Unreached
	case t.err != nil && errors.As(t.err, new(permanentError)):
		return Answered
	case t.err != nil:
		return Lost
	}
	if RetryReason(env, t.status, t.header, nil, true, false) == RetryUnavailable {
		return Overloaded
	}
	return Answered
}

// attempt sends env's request to u with client.
func attempt(ctx context.Context, opts *Options, client *http.Client, u string, env *invocation.Envelope, body []byte, fence, node string, wrote func(bool)) (t tried) {
	// Nothing can have reached the function before the transport had a
	// connection (GotConn runs on Do's goroutine, before anything is
	// written); once it had one, only an answer proves anything.
	var connected atomic.Bool
	rctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:      func(httptrace.GotConnInfo) { connected.Store(true) },
		WroteRequest: func(i httptrace.WroteRequestInfo) { wrote(i.Err == nil) },
	})
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		wrote(false)
		t.err = err
		return t
	}
	req.Header.Set("Content-Type", invocation.ContentType)
	req.Header.Set(invocation.HeaderSession, env.Session)
	req.Header.Set(invocation.HeaderInvocation, env.Invocation)
	req.Header.Set(invocation.HeaderFunction, env.Function)
	req.Header.Set(invocation.HeaderAttempt, strconv.Itoa(env.Attempt))
	if key := env.Key(); validHeaderValue(key) {
		req.Header.Set(invocation.HeaderIdempotencyKey, key)
	}
	if fence != "" {
		req.Header.Set(invocation.HeaderOwnerFence, fence)
	}
	if opts.KeepReport {
		req.Header.Set(invocation.HeaderKeepReport, "1")
	}
	if refs := env.Refs(); len(refs) > 0 {
		req.Header.Set(invocation.HeaderRefs, strings.Join(refs, ","))
	}
	if node != "" {
		req.Header.Set(invocation.HeaderProducerNode, node)
	}
	resp, err := client.Do(req)
	t.written = connected.Load()
	if err != nil {
		wrote(false)
		t.err = err
		return t
	}
	t.written = true
	wrote(true) // a response: the request arrived
	defer resp.Body.Close()
	t.status, t.header = resp.StatusCode, resp.Header
	data, err := io.ReadAll(io.LimitReader(resp.Body, opts.MaxBody+1))
	if err == nil && int64(len(data)) > opts.MaxBody {
		t.err = permanentError{fmt.Errorf("response of %s/%s exceeds %d bytes: send large outputs as objects", env.Namespace, env.Function, opts.MaxBody)}
		_, _ = io.Copy(io.Discard, resp.Body)
		return t
	}
	t.body, t.err = data, err
	return t
}

// Retry reasons (RetryReason), the label of the dispatcher's retry metric.
const (
	RetryNotSent      = "not_sent"      // the request never had a connection: it cannot have reached the function
	RetryRefused      = "refused"       // nothing listens (connection refused)
	RetryDNS          = "dns"           // the name did not resolve
	RetryResolve      = "resolve"       // the service's URL is not known yet
	RetryUnavailable  = "unavailable"   // 502, 503 or 429 from Knative's activator, ingress or queue-proxy, before the function
	RetryLostResponse = "lost_response" // the answer was lost; the receiver honours the idempotency key
	RetryGateway      = "gateway_timeout"
)

// RetryReason says why a failed try may be sent again ("" when it may
// not). Safe to retry is what provably did not reach the function — a
// request that never had a connection (written false: dial errors,
// connection refused, DNS, an unknown URL) and 502, 503 or 429 answered
// before it (by Knative's
// activator, ingress or queue-proxy overload: an answer without the
// request's idempotency key, which the function's sidecar puts on every
// answer it gives) — and, when the receiver honours the idempotency key
// (honoured), a delivery whose answer was lost or timed out at a gateway:
// its sidecar answers the duplicate from its record or waits for the run
// in progress. A timeout of the call itself is never retried: it is
// reported as a failure for the engine's re-execution rules, which run
// a new attempt under a new key. env may be nil (no key known).
func RetryReason(env *invocation.Envelope, status int, header http.Header, err error, written, honoured bool) string {
	var perm permanentError
	if errors.As(err, &perm) || errors.Is(err, context.Canceled) {
		return ""
	}
	if err != nil {
		if !written {
			var dns *net.DNSError
			switch {
			case errors.As(err, new(resolveError)):
				return RetryResolve
			case errors.Is(err, syscall.ECONNREFUSED):
				return RetryRefused
			case errors.As(err, &dns):
				return RetryDNS
			}
			return RetryNotSent
		}
		if isTimeout(err) {
			return ""
		}
		if honoured {
			return RetryLostResponse
		}
		return ""
	}
	echoed := env != nil && header != nil && header.Get(invocation.HeaderIdempotencyKey) == env.Key()
	switch status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusTooManyRequests:
		if !echoed {
			return RetryUnavailable
		}
	case http.StatusGatewayTimeout:
		if honoured && !echoed {
			return RetryGateway
		}
	}
	return ""
}

// resolveError is a URL that could not be resolved: nothing was sent.
type resolveError struct{ error }

func (r resolveError) Unwrap() error { return r.error }

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// permanentError is a failure that a retry cannot fix.
type permanentError struct{ error }

func (p permanentError) Unwrap() error { return p.error }

// validHeaderValue reports whether v can travel as a header value as is: a
// node name that cannot (control characters) is dropped rather than failing
// the request, since locality is a preference only.
func validHeaderValue(v string) bool {
	return !strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == 0x7f })
}
