package ziptrail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Invocation is what a function receives.
type Invocation struct {
	Namespace string
	Workflow  string
	Function  string
	Session   string
	ID        string
	Attempt   int
	// IdempotencyKey identifies this execution of the invocation:
	// "<session>/<invocation>/<attempt>". Every delivery of it carries the
	// same key (ziptrail delivers invocations at least once; the pod's
	// sidecar, and FunctionHandler, answer a duplicate that reaches them
	// from their records), and a re-execution has a new one. Use it to
	// make side effects outside ziptrail (a database write, a payment, a
	// message) happen once: a key still runs again in a restarted function
	// process or another pod.
	IdempotencyKey string
	Trigger        string
	Group          string // DynamicGroup's group
	Args           []byte
	Objects        []*Object
}

// Object returns the input with the given bucket and key, or nil.
func (inv *Invocation) Object(bucket, key string) *Object {
	for _, o := range inv.Objects {
		if o.Bucket == bucket && o.Key == key {
			return o
		}
	}
	return nil
}

// Handler runs one invocation; its result is the HTTP response body.
type Handler func(ctx context.Context, inv *Invocation) ([]byte, error)

// Serve runs handler for every invocation on $PORT (8080 when unset), the
// user container's port behind queue-proxy-zl, until ctx ends.
func Serve(ctx context.Context, handler Handler) error {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: FunctionHandler(handler), ReadHeaderTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// FunctionHandler adapts a Handler to HTTP: it decodes the invocation
// envelope, maps the inputs, calls the handler and unmaps them. A
// malformed envelope gets 400 with the reason.
//
// Inputs arrive inline or, when the pod's sidecar pulled them, as files it
// placed in the object directory (ZIPTRAIL_SHM_DIR, read when the handler
// is made). Only such files are opened: a bare name of the form the
// sidecar gives, directly inside that directory, a regular file, not a
// symlink. An envelope naming any other path (a request straight to this
// port, bypassing the sidecar) is refused with 400.
//
// Idempotency records: an invocation (a POST; probes are not) whose
// envelope carries the idempotency key the pod's sidecar sets runs the
// handler at most once per FunctionHandler (per function process, with
// Serve): a delivery of a key that already ran gets that run's answer —
// status, the headers this handler set, body, plus
// Ziptrail-Idempotent-Replay: 1 — without calling the handler, and one
// that arrives while the key runs waits for that run. The answer is
// recorded before it is written, so a caller that died (a sidecar
// SIGKILLed mid-call) does not lose it: the dispatcher's resend through
// the restarted sidecar gets it. For the same reason such a run's context
// is not cancelled when its caller goes away (it keeps the request's
// values; the sidecar runs an invocation detached from its caller too). A
// failure (500) is an answer like any other. Records are bounded — 4,096
// keys, 64 MiB of answers, oldest out first, each kept 10 minutes — and an
// answer over 16 MiB is not recorded (a resend of its key runs again). A
// request without that key, or from anywhere but the loopback interface
// (straight to the pod's IP, not through the sidecar), is never recorded
// and never answered from a record. The records live in the process: a new
// process (the function container restarted) runs a resent key again,
// which is why delivery is at least once (docs/guarantees.md). The Python
// SDK's server does the same.
func FunctionHandler(handler Handler) http.Handler {
	return functionHandler(handler, newFnRecords())
}

// fromThisPod reports whether r came over the loopback interface: from the
// pod's sidecar (queue-proxy-zl reaches the user container at 127.0.0.1,
// as Knative's queue-proxy does), not from elsewhere in the cluster
// straight to the pod's IP. Only such requests use the idempotency records.
func fromThisPod(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

func functionHandler(handler Handler, records *fnRecords) http.Handler {
	dir := ConfigFromEnv().ShmDir
	if dir == "" {
		dir = defaultShmDir
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, err := invocation.Decode(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		inv := &Invocation{Namespace: env.Namespace, Workflow: env.Workflow, Function: env.Function, Session: env.Session,
			ID: env.Invocation, Attempt: env.Attempt, IdempotencyKey: env.IdempotencyKey, Trigger: env.Trigger, Group: env.Group, Args: env.Args}
		local := fromThisPod(r)
		if inv.IdempotencyKey == "" || !local { // no sidecar set it: the same derivation, nothing recorded
			inv.IdempotencyKey = env.Key()
		}
		defer func() { unmapAll(inv.Objects) }()
		if env.IdempotencyKey == "" || r.Method != http.MethodPost || !local {
			// Not through the pod's sidecar, or not an invocation: not
			// recorded, and no record answers it (a caller straight to the
			// pod's IP may not read another invocation's answer by its key).
			res, _ := invoke(r.Context(), handler, dir, env, inv)
			res.write(w, false)
			return
		}
		// A path the sidecar cannot have given is refused before the
		// record is looked up, as when the inputs are opened.
		if err := checkPaths(env); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		run, ans := records.acquire(r.Context(), env.IdempotencyKey)
		if run == nil {
			if ans != nil { // the inputs are not opened for a replay
				ans.write(w, true)
			}
			return // else its caller left while it waited
		}
		recorded := false
		defer func() {
			if !recorded { // no answer: the inputs did not open, or the handler panicked
				records.abandon(run)
			}
		}()
		res, ran := invoke(context.WithoutCancel(r.Context()), handler, dir, env, inv)
		if ran {
			// Before the answer is written: a caller gone by now (its
			// sidecar killed) would otherwise cost the key a second run
			// when it is resent. A copy: the handler's result may be a
			// mapped input, unmapped once this returns.
			if res.alias {
				res.body = bytes.Clone(res.body)
			}
			records.finish(run, &res.fnAnswer)
			recorded = true
		}
		res.write(w, false)
	})
}

// invokeAnswer is a run's answer; alias says its body is the handler's
// result itself (which may be a mapped input).
type invokeAnswer struct {
	fnAnswer
	alias bool
}

// invoke opens the inputs into inv.Objects (the caller unmaps them) and
// calls the handler; ran says whether it did (else the answer is why not).
func invoke(ctx context.Context, handler Handler, dir string, env *invocation.Envelope, inv *Invocation) (*invokeAnswer, bool) {
	for _, o := range env.Objects {
		obj, err := openObject(dir, o)
		if err != nil {
			code := http.StatusInternalServerError
			if IsKind(err, KindInvalid) {
				code = http.StatusBadRequest
			}
			return errorAnswer(code, err.Error()), false
		}
		inv.Objects = append(inv.Objects, obj)
	}
	outs := &outputs{}
	ctx = context.WithValue(withInvocation(ctx, inv), outputsKey{}, outs)
	out, err := handler(ctx, inv)
	if err != nil {
		return errorAnswer(http.StatusInternalServerError, err.Error()), true
	}
	if len(outs.objects) == 0 {
		return &invokeAnswer{fnAnswer: fnAnswer{status: http.StatusOK, header: http.Header{}, body: out}, alias: true}, true
	}
	// Objects sent during the invocation travel back with the response,
	// inline (copies): the operator makes them ready in their buckets.
	body, err := json.Marshal(invocation.Outputs{Objects: outs.objects, Return: out})
	if err != nil {
		return errorAnswer(http.StatusInternalServerError, err.Error()), true
	}
	return &invokeAnswer{fnAnswer: fnAnswer{status: http.StatusOK, header: http.Header{"Content-Type": {invocation.OutputsContentType}}, body: body}}, true
}

// checkPaths refuses the envelope's input paths that are not names the
// pod's sidecar gives (openObject's check, without opening anything).
func checkPaths(env *invocation.Envelope) error {
	for _, o := range env.Objects {
		if o.Inline == nil && o.Path != "" && !invocation.IsInputName(o.Path) {
			return &Error{Kind: KindInvalid, Op: "open input", Err: fmt.Errorf("object %s/%s: %w: %q is not a name the pod's sidecar gives its inputs",
				o.Bucket, o.Key, invocation.ErrBadPath, o.Path)}
		}
	}
	return nil
}

// errorAnswer is http.Error's answer.
func errorAnswer(code int, msg string) *invokeAnswer {
	return &invokeAnswer{fnAnswer: fnAnswer{status: code, body: []byte(msg + "\n"),
		header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}, "X-Content-Type-Options": {"nosniff"}}}}
}

// openObject gives an input's bytes: inline ones as they are, else the
// file the sidecar placed in dir, mapped (the sidecar owns the file and
// removes it once the response passed, so it is not unlinked here).
func openObject(dir string, o invocation.Object) (*Object, error) {
	obj := &Object{Bucket: o.Bucket, Key: o.Key, Size: o.Size, Metadata: o.Metadata}
	switch {
	case o.Inline != nil:
		obj.data, obj.Size = o.Inline, int64(len(o.Inline))
		return obj, nil
	case o.Path == "":
		return nil, &Error{Kind: KindInvalid, Op: "open input", Err: fmt.Errorf(
			"object %s/%s arrived unresolved (reference only): is the pod's sidecar queue-proxy-zl?", o.Bucket, o.Key)}
	}
	f, st, err := invocation.OpenInput(dir, o.Path)
	if err != nil {
		return nil, &Error{Kind: KindInvalid, Op: "open input", Err: fmt.Errorf("object %s/%s: %w", o.Bucket, o.Key, err)}
	}
	defer f.Close()
	data, mapped, err := mapOpen(f, st.Size())
	if err != nil {
		return nil, &Error{Kind: KindInternal, Op: "open input", Err: err}
	}
	obj.data, obj.mapped, obj.Size = data, mapped, int64(len(data))
	return obj, nil
}

func unmapAll(objs []*Object) {
	for _, o := range objs {
		_ = o.Close()
	}
}

type invocationKey struct{}

type outputsKey struct{}

type outputs struct {
	mu      sync.Mutex
	objects []invocation.Object
}

func withInvocation(ctx context.Context, inv *Invocation) context.Context {
	return context.WithValue(ctx, invocationKey{}, inv)
}

// CurrentInvocation returns the invocation a handler's context belongs to;
// the SDK uses it to tag outputs with the session.
func CurrentInvocation(ctx context.Context) (*Invocation, bool) {
	inv, ok := ctx.Value(invocationKey{}).(*Invocation)
	return inv, ok
}
