package ziptrail

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Put buffers obj in this pod for n reads (Zipline's put(obj, N)) and
// returns its reference: an opaque string any function of the namespace
// can Get, n times, until the TTL passes. The bytes stay in the sidecar's
// memory until consumers pull them; obj may be reused once Put returns.
//
// A large obj is written into a file of the shared-memory directory: one
// the sidecar gave back once an earlier object was freed when there is
// one (docs/dataplane.md, "Reused files").
func (c *Client) Put(ctx context.Context, obj []byte, n int, opts ...Option) (string, error) {
	if n < 1 {
		return "", &Error{Kind: KindInvalid, Op: "put", Err: fmt.Errorf("reads must be at least 1, got %d", n)}
	}
	o := collect(ctx, opts)
	resp, err := c.api.PutObject(ctx, obj, &sidecarv1.PutRequest{Reads: uint32(n), TtlMs: o.ttl.Milliseconds(), Session: o.session})
	var werr *localapi.PayloadError
	if errors.As(err, &werr) {
		return "", &Error{Kind: KindInternal, Op: "put", Err: fmt.Errorf("write to the shared-memory directory: %w", werr.Err)}
	}
	if err != nil {
		return "", rpcError(ctx, "put", err)
	}
	return resp.GetRef(), nil
}

// Get retrieves a referenced object (Zipline's get(ref)): from this pod,
// from its producer pod, or from a storage tier when the producer is gone.
// A large object is a mapping of the file the sidecar pulled it into (no
// copy); Close it when done.
func (c *Client) Get(ctx context.Context, ref string) (*Object, error) {
	resp, m, err := c.api.GetMapped(ctx, ref)
	if err != nil {
		if resp != nil { // answered, but the file could not be mapped
			return nil, &Error{Kind: KindInternal, Op: "get", Err: err}
		}
		return nil, rpcError(ctx, "get", err)
	}
	return lentObject(resp, m), nil
}

// lentObject wraps what GetMapped returned: the file (when there is one)
// is the sidecar's, lent until Close.
func lentObject(resp *sidecarv1.GetResponse, m *localapi.Mapped) *Object {
	return &Object{Size: int64(len(m.Data)), Source: resp.GetSource(), data: m.Data, mapped: m.Mapped, lent: m}
}

// object turns a response's payload into an Object.
func (c *Client) object(op string, resp *sidecarv1.GetResponse) (*Object, error) {
	obj := &Object{Size: resp.GetSize(), Source: resp.GetSource()}
	switch src := resp.GetObject().GetSource().(type) {
	case *sidecarv1.Payload_Inline:
		obj.data = src.Inline
		if obj.data == nil {
			obj.data = []byte{}
		}
	case *sidecarv1.Payload_Path:
		data, mapped, err := mapFile(src.Path, true)
		if err != nil {
			return nil, &Error{Kind: KindInternal, Op: op, Err: err}
		}
		obj.data, obj.mapped = data, mapped
	default:
		return nil, &Error{Kind: KindInternal, Op: op, Err: errors.New("the sidecar answered without an object")}
	}
	obj.Size = int64(len(obj.data))
	return obj, nil
}

// Response is what an invoked function answered.
type Response struct {
	StatusCode  int
	ContentType string
	// Body is the function's return value.
	Body []byte
	// Outputs are the objects the function sent to buckets during the call
	// (SendObject in a handler); large ones by reference, for Get.
	Outputs []Output
}

// Output is an object a function sent during an invocation.
type Output struct {
	Bucket, Key string
	Size        int64
	Ref         string // set for large objects: Get it
	Inline      []byte // set for small objects
	Metadata    map[string]string
}

// Invoke calls the function at url with obj (Zipline's invoke(url, obj))
// and waits for its answer. obj is buffered in this pod for exactly one
// read and the callee's sidecar pulls it (small objects travel inline);
// the function receives it as its one input object. A function answering
// with a non-2xx status yields both the Response and an ErrFunctionFailed.
func (c *Client) Invoke(ctx context.Context, url string, obj []byte, opts ...Option) (*Response, error) {
	p, err := c.api.Payload(obj)
	if err != nil {
		return nil, &Error{Kind: KindInternal, Op: "invoke", Err: fmt.Errorf("write to the shared-memory directory: %w", err)}
	}
	o := collect(ctx, opts)
	resp, err := c.api.RPC().Invoke(ctx, &sidecarv1.InvokeRequest{Url: url, Function: o.function, Session: o.session,
		Bucket: o.bucket, Key: o.key, Object: p, Args: o.args})
	if err != nil {
		discard(p)
		return nil, rpcError(ctx, "invoke", err)
	}
	return response(url, int(resp.GetStatus()), resp.GetContentType(), resp.GetErrorReason(), resp.GetBody())
}

// InvokeRef calls the function at url with an object already put (by its
// reference, which the callee's sidecar resolves). It posts the invocation
// itself rather than through this pod's sidecar, so one Put can feed many
// calls (see Broadcast).
func (c *Client) InvokeRef(ctx context.Context, url, ref string, opts ...Option) (*Response, error) {
	o := collect(ctx, opts)
	id := newID()
	env := invocation.Envelope{Function: o.function, Session: o.session, Invocation: id, Args: o.args,
		Objects: []invocation.Object{{Bucket: o.bucket, Key: o.key, Ref: ref}}}
	if inv, ok := CurrentInvocation(ctx); ok {
		env.Namespace, env.Workflow = inv.Namespace, inv.Workflow
	}
	if env.Function == "" {
		env.Function = url
	}
	if env.Session == "" {
		env.Session = id
	}
	if env.Objects[0].Bucket == "" {
		env.Objects[0].Bucket = "input"
	}
	if env.Objects[0].Key == "" {
		env.Objects[0].Key = id
	}
	body, err := json.Marshal(&env)
	if err != nil {
		return nil, &Error{Kind: KindInternal, Op: "invoke", Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, &Error{Kind: KindInvalid, Op: "invoke", Err: err}
	}
	req.Header.Set("Content-Type", invocation.ContentType)
	req.Header.Set(invocation.HeaderSession, env.Session)
	req.Header.Set(invocation.HeaderInvocation, env.Invocation)
	req.Header.Set(invocation.HeaderFunction, env.Function)
	req.Header.Set(invocation.HeaderRefs, ref)
	hresp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, &Error{Kind: KindTimeout, Op: "invoke", Err: err}
		}
		return nil, &Error{Kind: KindUnavailable, Op: "invoke", Err: err}
	}
	defer hresp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(hresp.Body, invocation.MaxEnvelopeBytes+1))
	if err != nil {
		return nil, &Error{Kind: KindUnavailable, Op: "invoke", Err: fmt.Errorf("read the response of %s: %w", url, err)}
	}
	if len(out) > invocation.MaxEnvelopeBytes {
		return nil, &Error{Kind: KindTooLarge, Op: "invoke", Err: fmt.Errorf("%s answered more than %d bytes; return large objects by reference", url, invocation.MaxEnvelopeBytes)}
	}
	return response(url, hresp.StatusCode, hresp.Header.Get("Content-Type"), hresp.Header.Get(invocation.HeaderErrorReason), out)
}

// response decodes a function's answer, unpacking sent objects. reason is
// the callee sidecar's error class when it could not resolve the inputs:
// the error then has that class's kind (e.g. ErrProducerGone), not
// ErrFunctionFailed, since the function never ran.
func response(url string, code int, contentType, reason string, body []byte) (*Response, error) {
	r := &Response{StatusCode: code, ContentType: contentType, Body: body}
	if code/100 != 2 {
		msg := strings.TrimSpace(string(body[:min(len(body), 1024)]))
		e := &Error{Kind: KindFunctionFailed, Op: "invoke", Err: fmt.Errorf("%s answered %d: %s", url, code, msg)}
		if kind, ok := reasonKinds[reason]; ok {
			e.Kind, e.Reason = kind, reason
		}
		return r, e
	}
	if strings.HasPrefix(contentType, invocation.OutputsContentType) {
		outs, err := invocation.DecodeOutputs(body)
		if err != nil {
			return r, &Error{Kind: KindInternal, Op: "invoke", Err: err}
		}
		r.Body = outs.Return
		for _, o := range outs.Objects {
			r.Outputs = append(r.Outputs, Output{Bucket: o.Bucket, Key: o.Key, Size: o.Size, Ref: o.Ref, Inline: o.Inline, Metadata: o.Metadata})
		}
	}
	return r, nil
}

// discard removes a payload file the sidecar did not take over.
func discard(p *sidecarv1.Payload) {
	if path := p.GetPath(); path != "" {
		_ = os.Remove(path)
	}
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sdk-" + hex.EncodeToString(b[:])
}

// Put buffers obj for n reads through the default client; see Client.Put.
func Put(ctx context.Context, obj []byte, n int, opts ...Option) (string, error) {
	c, err := must("put")
	if err != nil {
		return "", err
	}
	return c.Put(ctx, obj, n, opts...)
}

// Get retrieves a referenced object through the default client; see
// Client.Get.
func Get(ctx context.Context, ref string) (*Object, error) {
	c, err := must("get")
	if err != nil {
		return nil, err
	}
	return c.Get(ctx, ref)
}

// Invoke calls a function through the default client; see Client.Invoke.
func Invoke(ctx context.Context, url string, obj []byte, opts ...Option) (*Response, error) {
	c, err := must("invoke")
	if err != nil {
		return nil, err
	}
	return c.Invoke(ctx, url, obj, opts...)
}
