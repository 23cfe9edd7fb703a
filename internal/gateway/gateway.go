// Package gateway is the session gateway's HTTP API: start a session of a
// Workflow with an input, query its state and progress, stream its events,
// and fetch its result. The SDK admin clients and the CLI use it.
//
//	POST /v1/namespaces/{ns}/workflows/{wf}/sessions     body: input     -> 201 Session
//	GET  /v1/namespaces/{ns}/sessions[?workflow=wf]                       -> 200 [Session]
//	GET  /v1/namespaces/{ns}/sessions/{id}                                -> 200 Session
//	GET  /v1/namespaces/{ns}/sessions/{id}/result[?wait=30s]              -> 200 bytes | 202 | 409 | 410
//	GET  /v1/namespaces/{ns}/sessions/{id}/events                         -> text/event-stream
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ziptrail/ziptrail/internal/sessions"
)

// Starter starts a session of a workflow (the trigger engine's adapter).
type Starter interface {
	StartSession(ctx context.Context, namespace, workflow string, input []byte) (id string, err error)
}

// ResultReader opens a completed session's result object, pulling it from
// its producer or a storage tier when it is not inline.
type ResultReader interface {
	OpenResult(ctx context.Context, namespace string, r *sessions.Result) (io.ReadCloser, error)
}

// Error kinds a Starter may wrap so the gateway answers with the right status.
var (
	ErrWorkflowNotFound = errors.New("workflow not found")
	ErrWorkflowNotReady = errors.New("workflow not ready")
)

// Handler serves the API.
type Handler struct {
	Starter  Starter
	Sessions *sessions.Registry
	Results  ResultReader
	MaxInput int64         // request body limit; default 64 MiB
	MaxWait  time.Duration // longest ?wait=; default 10m
	mux      *http.ServeMux
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
	h.mux.HandleFunc("GET /v1/namespaces/{ns}/sessions/{id}/events", h.events)
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func (h *Handler) start(w http.ResponseWriter, r *http.Request) {
	input, err := io.ReadAll(io.LimitReader(r.Body, h.MaxInput+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read input: %v", err)
		return
	}
	if int64(len(input)) > h.MaxInput {
		writeError(w, http.StatusRequestEntityTooLarge, "input exceeds %d bytes: put large inputs into a bucket and pass a reference", h.MaxInput)
		return
	}
	ns, wf := r.PathValue("ns"), r.PathValue("wf")
	id, err := h.Starter.StartSession(r.Context(), ns, wf, input)
	switch {
	case errors.Is(err, ErrWorkflowNotFound):
		writeError(w, http.StatusNotFound, "%v", err)
		return
	case errors.Is(err, ErrWorkflowNotReady):
		writeError(w, http.StatusConflict, "%v", err)
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, "start session: %v", err)
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

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, h.Sessions.List(r.PathValue("ns"), r.URL.Query().Get("workflow")))
}

// session finds a session and checks it belongs to the namespace in the path.
func (h *Handler) session(w http.ResponseWriter, r *http.Request) (sessions.Session, bool) {
	s, err := h.Sessions.Get(r.PathValue("id"))
	if err != nil || s.Namespace != r.PathValue("ns") {
		writeError(w, http.StatusNotFound, "session %s not found in namespace %s", r.PathValue("id"), r.PathValue("ns"))
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
			writeError(w, http.StatusBadRequest, "wait must be a duration like 30s: %q", waitArg)
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
		writeError(w, http.StatusBadGateway, "read result %s/%s: %v", s.Result.Bucket, s.Result.Key, err)
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Ziptrail-Result-Bucket", s.Result.Bucket)
	w.Header().Set("Ziptrail-Result-Key", s.Result.Key)
	if s.Result.Size > 0 {
		w.Header().Set("Content-Length", fmt.Sprint(s.Result.Size))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, body)
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
