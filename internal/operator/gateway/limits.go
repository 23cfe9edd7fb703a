package gateway

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Per-namespace limits (docs/limits.md): what one tenant may take of what
// every tenant shares. The engine's (running sessions, objects and bytes
// held) and the input store's are the orchestrator's; the gateway's own is
// a rate of requests per namespace (RateLimit). A request or start over a
// limit is answered 429 Too Many Requests (gRPC RESOURCE_EXHAUSTED) with a
// message naming the limit, and counted in ziptrail_limits_refused_total.

// ErrLimit is what every refusal by a per-namespace limit wraps
// (errors.Is): the gateway answers it 429 (gRPC RESOURCE_EXHAUSTED).
var ErrLimit = errors.New("a per-namespace limit is reached")

// LimitError is a request refused by a per-namespace limit.
type LimitError struct {
	Limit     string // the limit's name: sessionsPerNamespace, requestsPerSecond, ...
	Namespace string
	Msg       string // says what is held and the limit, e.g. "namespace team-a has 1000 running sessions, the limit sessionsPerNamespace is 1000"
	// RetryAfter is when trying again may succeed (Retry-After); zero: 5 s.
	RetryAfter time.Duration
}

func (e *LimitError) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrLimit) true.
func (e *LimitError) Is(target error) bool { return target == ErrLimit }

// Limit names of the gateway and the input store (the engine's are in
// package engine: sessionsPerNamespace, objectsPerSession, ...).
const (
	LimitRequestsPerSecond      = "requestsPerSecond"
	LimitInputBytesPerNamespace = "inputBytesPerNamespace"
)

var limitsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ziptrail_limits_refused_total",
	Help: "Requests, session starts and sidecar events refused (or sessions ended) by a per-namespace limit, by limit " +
		"(sessionsPerNamespace, objectsPerSession, objectsPerNamespace, bytesPerSession, bytesPerNamespace, " +
		"inputBytesPerNamespace, requestsPerSecond) and namespace (docs/limits.md).",
}, []string{"limit", "namespace"})

func init() { metrics.Registry.MustRegister(limitsRefused) }

// CountLimit counts a refusal by limit in namespace.
func CountLimit(limit, namespace string) { limitsRefused.WithLabelValues(limit, namespace).Inc() }

// retryAfter sets Retry-After on a 429 (from a *LimitError in err, if any).
func retryAfter(w http.ResponseWriter, code int, err error) {
	if code != http.StatusTooManyRequests {
		return
	}
	d := 5 * time.Second
	var le *LimitError
	if errors.As(err, &le) && le.RetryAfter > 0 {
		d = le.RetryAfter
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
}

// RateLimit bounds the requests each namespace makes to the gateway: a
// token bucket per namespace, PerSecond tokens a second up to Burst. A
// request is charged once authenticated and authorized (an anonymous
// caller cannot spend a namespace's budget), and refused beyond it with
// 429 Too Many Requests (RESOURCE_EXHAUSTED) and Retry-After. Every
// replica keeps its own buckets: a request one replica forwards to
// another (the sharded engine's routing) is charged on both. A nil
// *RateLimit, or PerSecond 0, limits nothing.
type RateLimit struct {
	PerSecond float64
	Burst     int // default: PerSecond (at least 1)
	// Refused, when set, learns each refusal (the operator records a
	// Kubernetes Event on the workflow named, if any).
	Refused func(namespace, workflow string, err *LimitError)
	Now     func() time.Time

	mu      sync.Mutex
	buckets map[string]*tokenBucket
}

type tokenBucket struct {
	tokens float64
	last   time.Time
}

// maxBuckets bounds the namespaces tracked; past it, buckets that have
// refilled (idle namespaces) are forgotten.
const maxBuckets = 4096

func (r *RateLimit) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *RateLimit) burst() float64 {
	if r.Burst > 0 {
		return float64(r.Burst)
	}
	return math.Max(1, r.PerSecond)
}

// allow charges one request of a.Namespace; an *AuthError with 429 (which
// wraps a *LimitError) when the namespace is over its rate.
func (r *RateLimit) allow(a Attributes) error {
	if r == nil || r.PerSecond <= 0 {
		return nil
	}
	now, burst := r.now(), r.burst()
	r.mu.Lock()
	if r.buckets == nil {
		r.buckets = map[string]*tokenBucket{}
	}
	b := r.buckets[a.Namespace]
	if b == nil {
		if len(r.buckets) >= maxBuckets {
			r.prune(now, burst)
		}
		b = &tokenBucket{tokens: burst, last: now}
		r.buckets[a.Namespace] = b
	}
	b.refill(now, r.PerSecond, burst)
	ok := b.tokens >= 1
	wait := time.Duration((1 - b.tokens) / r.PerSecond * float64(time.Second))
	if ok {
		b.tokens--
	}
	r.mu.Unlock()
	if ok {
		return nil
	}
	le := &LimitError{Limit: LimitRequestsPerSecond, Namespace: a.Namespace, RetryAfter: max(wait, time.Second),
		Msg: fmt.Sprintf("namespace %s made more requests to the session gateway than its rate allows, the limit %s is %g a second "+
			"(bursts of %g): retry later", a.Namespace, LimitRequestsPerSecond, r.PerSecond, burst)}
	CountLimit(le.Limit, a.Namespace)
	if r.Refused != nil {
		r.Refused(a.Namespace, a.Workflow, le)
	}
	return &rateError{AuthError{Code: http.StatusTooManyRequests, Msg: le.Msg}, le}
}

// rateError is a refusal by RateLimit: an *AuthError with 429 (how the
// HTTP and gRPC paths answer refused requests) that is also a
// *LimitError.
type rateError struct {
	AuthError
	limit *LimitError
}

func (e *rateError) Unwrap() []error { return []error{&e.AuthError, e.limit} }

func (b *tokenBucket) refill(now time.Time, rate, burst float64) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = math.Min(burst, b.tokens+d.Seconds()*rate)
		b.last = now
	}
}

// prune forgets the buckets that are full again (under r.mu).
func (r *RateLimit) prune(now time.Time, burst float64) {
	for ns, b := range r.buckets {
		b.refill(now, r.PerSecond, burst)
		if b.tokens >= burst {
			delete(r.buckets, ns)
		}
	}
}
