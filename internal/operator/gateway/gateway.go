// Package gateway is the session gateway's HTTP API: start a session of a
// Workflow with an input, query its state and progress, stream its events,
// and fetch its result. The SDK admin clients and the CLI use it; grpc.go
// serves the same operations over gRPC.
//
//	POST /v1/namespaces/{ns}/workflows/{wf}/sessions     body: input     -> 201 Session
//	GET  /v1/namespaces/{ns}/sessions[?workflow=wf]                       -> 200 [Session]
//	GET  /v1/namespaces/{ns}/sessions/{id}                                -> 200 Session
//	GET  /v1/namespaces/{ns}/sessions/{id}/result[?wait=30s]              -> 200 bytes | 202 | 409 | 410
//	DELETE /v1/namespaces/{ns}/sessions/{id}/result                       -> 204 (acknowledged) | 409
//	GET  /v1/namespaces/{ns}/sessions/{id}/events                         -> text/event-stream
//	POST /v1/namespaces/{ns}/shuffle/plan    body: plan request (JSON)    -> 200 plan (plan.go)
//
// Every request carries Kubernetes credentials (Authorization: Bearer
// <token>), authenticated with TokenReview and authorized with
// SubjectAccessReview on the sessions subresource of workflows.ziptrail.dev
// in the request's namespace (see auth.go): 401 without a valid token, 403
// with the reason when not allowed. Results stream from wherever they are
// held (inline, or pulled by reference from the producer's pod) to the
// client without being buffered whole. A result read whole stays readable
// until the client acknowledges it (DELETE …/result) or until a grace
// after its first full read passes (ResultAcker). A start carrying an
// Idempotency-Key header answers the same session for the same key
// (startkeys.go).
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ziptrail/ziptrail/internal/operator/sessions"

	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
)

// Starter starts a session of a workflow (the trigger engine's adapter).
// input holds size bytes (-1: unknown until read); the Starter decides how
// the input travels (inline, or held by reference) and enforces its caps.
type Starter interface {
	Start(ctx context.Context, namespace, workflow string, input io.Reader, size int64) (id string, err error)
}

// ResultReader opens a completed session's result object, pulling it from
// its producer when it is held by reference. The reader yields exactly
// r.Size bytes, streamed: a large result is never held whole.
type ResultReader interface {
	OpenResult(ctx context.Context, namespace string, r *sessions.Result) (io.ReadCloser, error)
}

// ResultAcker is a ResultReader that keeps a completed session's result
// readable until its client has it: Handler tells it when a result went
// out whole and when its client acknowledged it.
type ResultAcker interface {
	// ResultDelivered: the whole result was handed to a client's
	// connection (which may still break before the client has it all);
	// the first such read starts the grace after which the result may be
	// freed unacknowledged. A read cut short is never reported.
	ResultDelivered(namespace string, r *sessions.Result)
	// AckResult: the client has the result; it may be freed now.
	AckResult(namespace string, r *sessions.Result)
}

// Error kinds a Starter or ResultReader may wrap so the gateway answers
// with the right status.
var (
	ErrWorkflowNotFound = errors.New("workflow not found")
	ErrWorkflowNotReady = errors.New("workflow not ready")
	// ErrInputTooLarge: the input exceeds the largest input accepted.
	ErrInputTooLarge = errors.New("input too large")
	// ErrInputsFull: the memory reserved for session inputs is in use;
	// retry once running sessions finish.
	ErrInputsFull = errors.New("session inputs are using all the memory reserved for them")
	// ErrLengthRequired: a large input was sent without its length.
	ErrLengthRequired = errors.New("input length required")
	// ErrResultGone: the result object is no longer held anywhere.
	ErrResultGone = errors.New("result no longer available")
	// ErrEngineMoving: the workflow's engine bucket is changing owners
	// (docs/sharding.md); retry in a moment.
	ErrEngineMoving = errors.New(gatewayv1.EngineMovingMessage)
)

// SessionStore is where the gateway finds sessions: the engine's registry
// (*sessions.Registry), or the sharded engine's registries of the buckets
// this replica owns.
type SessionStore interface {
	Get(id string) (sessions.Session, error)
	List(namespace, workflow string) []sessions.Session
	Wait(ctx context.Context, id string) (sessions.Session, error)
	Watch(id string) (sessions.Session, <-chan struct{}, error)
}

// Handler serves the API.
type Handler struct {
	Starter  Starter
	Sessions SessionStore
	Results  ResultReader
	// Auth authenticates and authorizes every request; nil refuses every
	// request (the gateway never runs open).
	Auth     Authorizer
	MaxInput int64         // largest input accepted; default 64 MiB
	MaxWait  time.Duration // longest ?wait=; default 10m
	// Calibration gives the shuffle planner (plan.go) the installation's
	// calibration; nil plans with the built-in defaults.
	Calibration CalibrationSource
	// Owners, when set, send requests about workflows another operator
	// replica serves to that replica (proxy.go).
	Owners Owners
	// Limit bounds each namespace's rate of requests (limits.go); nil: none.
	Limit *RateLimit
	// RefusalsPerSecond paces each connection's refused requests
	// (pacing.go, ConnContext); 0: DefaultRefusalsPerSecond, negative: off.
	RefusalsPerSecond float64
	mux               *http.ServeMux
}

// New wires the routes.
func New(h *Handler) *Handler {
	if h.MaxInput <= 0 {
		h.MaxInput = 64 << 20
	}
	if h.MaxWait <= 0 {
		h.MaxWait = 10 * time.Minute
	}
	h.mux = http.NewServeMux()
	h.mux.HandleFunc("POST /v1/namespaces/{ns}/workflows/{wf}/sessions", h.start)
	h.mux.HandleFunc("GET /v1/namespaces/{ns}/sessions", h.list)
	h.mux.HandleFunc("GET /v1/namespaces/{ns}/sessions/{id}", h.get)
	h.mux.HandleFunc("GET /v1/namespaces/{ns}/sessions/{id}/result", h.result)
	h.mux.HandleFunc("DELETE /v1/namespaces/{ns}/sessions/{id}/result", h.ackResult)
	h.mux.HandleFunc("GET /v1/namespaces/{ns}/sessions/{id}/events", h.events)
	h.mux.HandleFunc("POST /v1/namespaces/{ns}/shuffle/plan", h.plan)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: %s %s (see the package documentation of the session gateway)", r.Method, r.URL.Path)
	})
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w = h.paced(w, r)
	if h.routed(w, r) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// allow authorizes a request, answering it when refused.
func (h *Handler) allow(ctx context.Context, token string, a Attributes) error {
	if h.Auth == nil {
		return &AuthError{Code: http.StatusServiceUnavailable, Msg: "the session gateway has no authorizer configured"}
	}
	if _, err := h.Auth.Authorize(ctx, token, a); err != nil {
		return authError(err)
	}
	return h.Limit.allow(a)
}

func (h *Handler) allowHTTP(w http.ResponseWriter, r *http.Request, a Attributes) bool {
	if err := h.allow(r.Context(), bearer(r.Header.Get("Authorization")), a); err != nil {
		ae := authError(err)
		if ae.Code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ziptrail session gateway"`)
		}
		retryAfter(w, ae.Code, err)
		writeError(w, ae.Code, "%s", ae.Msg)
		return false
	}
	return true
}

// checkNames validates the names a request carries before anything else
// sees them.
func checkNames(ns, wf string) error {
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return fmt.Errorf("invalid namespace %q: %s", truncate(ns), errs[0])
	}
	if wf != "" {
		if errs := validation.IsDNS1123Subdomain(wf); len(errs) > 0 {
			return fmt.Errorf("invalid workflow name %q: %s", truncate(wf), errs[0])
		}
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func (h *Handler) start(w http.ResponseWriter, r *http.Request) {
	ns, wf := r.PathValue("ns"), r.PathValue("wf")
	if err := checkNames(ns, wf); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if !h.allowHTTP(w, r, Attributes{Verb: "create", Namespace: ns, Workflow: wf}) {
		return
	}
	if r.ContentLength > h.MaxInput {
		writeError(w, http.StatusRequestEntityTooLarge, "input of %d bytes exceeds the gateway's limit of %d bytes: put large data into a bucket and pass its key", r.ContentLength, h.MaxInput)
		return
	}
	body := http.MaxBytesReader(w, r.Body, h.MaxInput)
	ctx, err := withKeyHeader(r.Context(), r.Header.Get(IdempotencyKeyHeader))
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	id, err := h.Starter.Start(ctx, ns, wf, body, r.ContentLength)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			err = fmt.Errorf("%w: more than the gateway's limit of %d bytes: put large data into a bucket and pass its key", ErrInputTooLarge, h.MaxInput)
		}
		code := startStatus(err)
		if code == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "5")
		}
		retryAfter(w, code, err)
		writeError(w, code, "%v", err)
		return
	}
	s, err := h.Sessions.Get(id)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "session %s started but is not tracked: %v", id, err)
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/v1/namespaces/%s/sessions/%s", ns, id))
	writeJSON(w, http.StatusCreated, s)
}

// startStatus is the HTTP status of a StartSession error.
func startStatus(err error) int {
	switch {
	case errors.Is(err, ErrWorkflowNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrWorkflowNotReady):
		return http.StatusConflict
	case errors.Is(err, ErrInputTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrLengthRequired):
		return http.StatusLengthRequired
	case errors.Is(err, ErrInputsFull), errors.Is(err, ErrEngineMoving), errors.Is(err, ErrNotSaved):
		return http.StatusServiceUnavailable
	case errors.Is(err, ErrLimit):
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	ns, wf := r.PathValue("ns"), r.URL.Query().Get("workflow")
	if err := checkNames(ns, wf); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if !h.allowHTTP(w, r, Attributes{Verb: "list", Namespace: ns, Workflow: wf}) {
		return
	}
	list := h.Sessions.List(ns, wf)
	if list == nil {
		list = []sessions.Session{}
	}
	writeJSON(w, http.StatusOK, list)
}

// lookup finds a session of a namespace and authorizes reading it: get on
// the sessions of its workflow. An unknown session is authorized against
// the whole namespace, so a caller without access learns nothing of which
// sessions exist.
func (h *Handler) lookup(ctx context.Context, token, ns, id string) (sessions.Session, int, error) {
	if err := checkNames(ns, ""); err != nil {
		return sessions.Session{}, http.StatusBadRequest, err
	}
	s, err := h.Sessions.Get(id)
	found := err == nil && s.Namespace == ns
	a := Attributes{Verb: "get", Namespace: ns}
	if found {
		a.Workflow = s.Workflow
	}
	if err := h.allow(ctx, token, a); err != nil {
		return s, authError(err).Code, err
	}
	if !found {
		return s, http.StatusNotFound, fmt.Errorf("session %s not found in namespace %s", truncate(id), ns)
	}
	return s, http.StatusOK, nil
}

// session finds and authorizes the session of the path, answering the
// request when it cannot.
func (h *Handler) session(w http.ResponseWriter, r *http.Request) (sessions.Session, bool) {
	s, code, err := h.lookup(r.Context(), bearer(r.Header.Get("Authorization")), r.PathValue("ns"), r.PathValue("id"))
	if err != nil {
		if code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ziptrail session gateway"`)
		}
		retryAfter(w, code, err)
		writeError(w, code, "%v", err)
		return s, false
	}
	return s, true
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	if s, ok := h.session(w, r); ok {
		writeJSON(w, http.StatusOK, s)
	}
}

func (h *Handler) result(w http.ResponseWriter, r *http.Request) {
	s, ok := h.session(w, r)
	if !ok {
		return
	}
	if waitArg := r.URL.Query().Get("wait"); waitArg != "" && !s.State.Ended() {
		wait, err := time.ParseDuration(waitArg)
		if err != nil || wait < 0 {
			writeError(w, http.StatusBadRequest, "wait must be a duration like 30s: %q", truncate(waitArg))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), min(wait, h.MaxWait))
		defer cancel()
		s, _ = h.Sessions.Wait(ctx, s.ID)
	}
	switch s.State {
	case sessions.Running:
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusAccepted, s)
		return
	case sessions.Failed:
		writeError(w, http.StatusConflict, "session %s failed: %s", s.ID, s.Error)
		return
	case sessions.Expired:
		writeError(w, http.StatusGone, "session %s expired before it completed", s.ID)
		return
	}
	if s.Result == nil {
		writeError(w, http.StatusInternalServerError, "session %s completed without a result object", s.ID)
		return
	}
	body, err := h.Results.OpenResult(r.Context(), s.Namespace, s.Result)
	if err != nil {
		code := http.StatusBadGateway
		if errors.Is(err, ErrResultGone) {
			code = http.StatusGone
		}
		writeError(w, code, "read result %s/%s of session %s: %v", s.Result.Bucket, s.Result.Key, s.ID, err)
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Ziptrail-Result-Bucket", s.Result.Bucket)
	w.Header().Set("Ziptrail-Result-Key", s.Result.Key)
	w.Header().Set("Content-Length", strconv.FormatInt(s.Result.Size, 10))
	w.WriteHeader(http.StatusOK)
	if n, err := io.Copy(w, body); err != nil || n != s.Result.Size {
		// Headers are out: break the connection so the client sees a
		// truncated body instead of a short result that looks complete.
		panic(http.ErrAbortHandler)
	}
	if err := http.NewResponseController(w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		panic(http.ErrAbortHandler) // the connection broke before the end
	}
	h.delivered(s)
}

// delivered tells the ResultReader a session's result went out whole.
func (h *Handler) delivered(s sessions.Session) {
	if a, ok := h.Results.(ResultAcker); ok && s.Result != nil {
		a.ResultDelivered(s.Namespace, s.Result)
	}
}

// ackResult acknowledges a completed session's result: the client has it,
// so its objects may be freed now (ResultAcker). Acknowledging again, or
// the result of a session that failed or expired, is no error.
func (h *Handler) ackResult(w http.ResponseWriter, r *http.Request) {
	s, ok := h.session(w, r)
	if !ok {
		return
	}
	if code, err := h.ack(s); err != nil {
		writeError(w, code, "%v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ack acknowledges a session's result, or says why it cannot (an HTTP
// status).
func (h *Handler) ack(s sessions.Session) (int, error) {
	if s.State == sessions.Running {
		return http.StatusConflict, fmt.Errorf("session %s is still running: its result cannot be acknowledged before it is read", s.ID)
	}
	if a, ok := h.Results.(ResultAcker); ok && s.State == sessions.Completed && s.Result != nil {
		a.AckResult(s.Namespace, s.Result)
	}
	return http.StatusOK, nil
}

// events streams progress as server-sent events until the session ends.
func (h *Handler) events(w http.ResponseWriter, r *http.Request) {
	s, ok := h.session(w, r)
	if !ok {
		return
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sent := 0
	for {
		s, changed, err := h.Sessions.Watch(s.ID)
		if err != nil {
			return
		}
		// sent counts events by sequence number; ones trimmed from the
		// bounded log before this client saw them are skipped.
		sent = max(sent, s.FirstEvent)
		for _, e := range s.Events[sent-s.FirstEvent:] {
			data, _ := json.Marshal(e)
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.Kind, data)
		}
		sent = s.FirstEvent + len(s.Events)
		if flusher != nil {
			flusher.Flush()
		}
		if s.State.Ended() {
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, format string, args ...any) {
	writeJSON(w, code, map[string]string{"error": fmt.Sprintf(format, args...)})
}
