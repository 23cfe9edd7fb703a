package localapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Invoke implements Zipline's invoke(url, obj): the object is buffered
// here for exactly one read and the callee's sidecar pulls it; small
// objects travel inline. The call blocks until the callee answers.
func (s *Server) Invoke(ctx context.Context, req *sidecarv1.InvokeRequest) (*sidecarv1.InvokeResponse, error) {
	if req.GetUrl() == "" {
		return nil, toStatus(fmt.Errorf("%w: invoke needs a url", ErrBadPayload))
	}
	loadedObj, release, err := s.loadObject(ctx, req.GetObject(), "")
	if err != nil {
		return nil, toStatus(err)
	}
	defer release()
	data := loadedObj.data
	bucket, key := req.GetBucket(), req.GetKey()
	if bucket == "" {
		bucket = "input"
	}
	invID := s.newID("inv")
	if key == "" {
		key = invID
	}
	session := req.GetSession()
	if session == "" {
		session = invID
	}
	env := invocation.Envelope{Namespace: s.Namespace, Function: req.GetFunction(), Session: session, Invocation: invID, Args: req.GetArgs()}
	if env.Function == "" {
		env.Function = req.GetUrl()
	}
	obj := invocation.Object{Bucket: bucket, Key: key, Size: int64(len(data))}
	if len(data) <= s.InlineThreshold {
		obj.Inline = data
		if obj.Inline == nil {
			obj.Inline = []byte{}
		}
	} else {
		m := store.Meta{ID: invID, Session: session, Bucket: bucket, Key: key, Reads: 1, Expires: s.now().Add(s.ttl(0))}
		if obj.Ref, err = s.put(ctx, m, loadedObj); err != nil {
			return nil, toStatus(err)
		}
		release() // the store accounts for it now
		// Blocking call: whatever the callee did, the object is not needed
		// after it answered.
		defer s.Store.Remove(m.ID)
	}
	env.Objects = []invocation.Object{obj}
	resp, err := s.post(ctx, req.GetUrl(), &env)
	return resp, toStatus(err)
}

func (s *Server) post(ctx context.Context, url string, env *invocation.Envelope) (*sidecarv1.InvokeResponse, error) {
	body, err := json.Marshal(env)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	hreq.Header.Set("Content-Type", invocation.ContentType)
	hreq.Header.Set(invocation.HeaderSession, env.Session)
	hreq.Header.Set(invocation.HeaderInvocation, env.Invocation)
	hreq.Header.Set(invocation.HeaderFunction, env.Function)
	if refs := env.Refs(); len(refs) > 0 {
		hreq.Header.Set(invocation.HeaderRefs, refs[0])
	}
	hc := s.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	hresp, err := hc.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("invoke %s: %w", url, err)
	}
	defer hresp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(hresp.Body, invocation.MaxEnvelopeBytes+1))
	if err != nil {
		return nil, fmt.Errorf("invoke %s: read response: %w", url, err)
	}
	if len(out) > invocation.MaxEnvelopeBytes {
		return nil, fmt.Errorf("invoke %s: response exceeds %d bytes; return large objects by reference", url, invocation.MaxEnvelopeBytes)
	}
	return &sidecarv1.InvokeResponse{Status: int32(hresp.StatusCode), ContentType: hresp.Header.Get("Content-Type"), Body: out,
		ErrorReason: hresp.Header.Get(invocation.HeaderErrorReason)}, nil
}
