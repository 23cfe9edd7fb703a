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
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
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
	MaxTries    int           // attempts for transient failures; default 5
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
	// OnRetry, when set, is called before every retry.
	OnRetry func()
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

// Send sends env, retrying transport errors and Knative's transient
// statuses; a function that answers with an error is reported in Err, not
// retried (re-execution is the engine's decision). opts must have had
// Defaults applied.
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
	backoff := opts.BaseBackoff
	for res.Tries = 1; ; res.Tries++ {
		status, header, respBody, err := try(ctx, opts, env, body, res.Tries == 1)
		res.Status, res.Header, res.Body, res.Err = status, header, respBody, err
		if !Transient(status, err) || res.Tries >= opts.MaxTries || ctx.Err() != nil {
			break
		}
		if opts.OnRetry != nil {
			opts.OnRetry()
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
	if res.Err == nil && (res.Status < 200 || res.Status > 299) {
		res.Err = fmt.Errorf("function %s/%s answered %d: %s", env.Namespace, env.Function, res.Status, strings.TrimSpace(string(res.Body)))
	}
	res.Latency = time.Since(start)
	return res
}

func try(ctx context.Context, opts *Options, env *invocation.Envelope, body []byte, first bool) (int, http.Header, []byte, error) {
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
	u, err := opts.URL(ctx, env)
	if err != nil {
		wrote(false)
		return 0, nil, nil, fmt.Errorf("resolve %s/%s: %w", env.Namespace, env.Function, err)
	}
	rctx := ctx
	if first && opts.Wrote != nil {
		rctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) { wrote(i.Err == nil) }})
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		wrote(false)
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", invocation.ContentType)
	req.Header.Set(invocation.HeaderSession, env.Session)
	req.Header.Set(invocation.HeaderInvocation, env.Invocation)
	req.Header.Set(invocation.HeaderFunction, env.Function)
	req.Header.Set(invocation.HeaderAttempt, strconv.Itoa(env.Attempt))
	if refs := env.Refs(); len(refs) > 0 {
		req.Header.Set(invocation.HeaderRefs, strings.Join(refs, ","))
	}
	if opts.ProducerNode != nil {
		if node := opts.ProducerNode(env); node != "" && validHeaderValue(node) {
			req.Header.Set(invocation.HeaderProducerNode, node)
		}
	}
	resp, err := opts.Client.Do(req)
	if err != nil {
		wrote(false)
		return 0, nil, nil, err
	}
	wrote(true) // a response: the request arrived
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, opts.MaxBody+1))
	if err == nil && int64(len(data)) > opts.MaxBody {
		err = permanentError{fmt.Errorf("response of %s/%s exceeds %d bytes: send large outputs as objects", env.Namespace, env.Function, opts.MaxBody)}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header, nil, err
	}
	return resp.StatusCode, resp.Header, data, err
}

// Transient says whether a failure is the platform's (retry) rather than the
// function's (report): no response at all, or the statuses Knative's
// activator and ingress use while a revision is starting or overloaded.
func Transient(status int, err error) bool {
	var perm permanentError
	if errors.As(err, &perm) {
		return false
	}
	if err != nil {
		return true
	}
	switch status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout, http.StatusTooManyRequests:
		return true
	}
	return false
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

// RerunArgs encodes what a re-execution needs of the invocation it
// repeats (see dispatch.RerunArgs): the envelope as first sent, without
// its id and attempt.
func RerunArgs(env *invocation.Envelope) ([]byte, error) {
	orig := *env
	orig.Invocation, orig.Attempt = "", 0
	return json.Marshal(&orig)
}
