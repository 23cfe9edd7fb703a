package ziptrail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
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
	// sidecar answers a duplicate that reaches it from its record), and a
	// re-execution has a new one. Use it to make side effects outside
	// ziptrail (a database write, a payment, a message) happen once.
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
func FunctionHandler(handler Handler) http.Handler {
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
		if inv.IdempotencyKey == "" { // no sidecar set it: the same derivation
			inv.IdempotencyKey = env.Key()
		}
		defer func() { unmapAll(inv.Objects) }()
		for _, o := range env.Objects {
			obj, err := openObject(dir, o)
			if err != nil {
				code := http.StatusInternalServerError
				if IsKind(err, KindInvalid) {
					code = http.StatusBadRequest
				}
				http.Error(w, err.Error(), code)
				return
			}
			inv.Objects = append(inv.Objects, obj)
		}
		outs := &outputs{}
		ctx := context.WithValue(withInvocation(r.Context(), inv), outputsKey{}, outs)
		out, err := handler(ctx, inv)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if len(outs.objects) > 0 {
			// Objects sent during the invocation travel back with the
			// response; the operator makes them ready in their buckets.
			body, err := json.Marshal(invocation.Outputs{Objects: outs.objects, Return: out})
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", invocation.OutputsContentType)
			out = body
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		_, _ = w.Write(out)
	})
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
