package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"

	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// Owners say which operator replica serves a workflow when the engine is
// sharded across replicas (docs/sharding.md). A request about a workflow
// another replica serves is authorized here, then reverse-proxied to that
// replica with the caller's credentials (which it checks again: cached).
type Owners interface {
	// Route is "" when workflow namespace/name is served here, else the
	// owner's gateway address (host:port); an error when no replica
	// serves it at the moment (answered 503, retry).
	Route(ctx context.Context, namespace, workflow string) (addr, bucket string, err error)
	// Peers are the other replicas' gateway addresses (a listing of a
	// namespace's sessions asks each of them).
	Peers(ctx context.Context) ([]string, error)
}

// ProxiedHeader marks a request a replica forwarded: the replica it
// reaches never forwards it again. It grants nothing: anyone can set it,
// and the request is authorized as any other. A replica that serves the
// workflow answers it; one that does not (the replicas disagree for a
// moment while a bucket moves, or a client set the header itself) answers
// 503 with Retry-After, after authorization, instead of forwarding it on
// or answering from an engine that does not hold the workflow (a wrong
// 404). A namespace's listing marked so is this replica's part only: how
// a replica asks its peers for theirs.
const ProxiedHeader = "Ziptrail-Proxied"

// errNotServedHere is the answer to a forwarded request about a workflow
// this replica does not serve.
var errNotServedHere = errors.New("this operator replica does not serve the workflow (its engine bucket is moving)")

// sessionID is how session ids are made: <workflow>-<12 hex digits>.
var sessionID = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?)-[0-9a-f]{12}$`)

// WorkflowOfSession is the workflow a session id names ("" when it is not
// one the engine made).
func WorkflowOfSession(id string) string {
	m := sessionID.FindStringSubmatch(id)
	if m == nil {
		return ""
	}
	return m[1]
}

// routed answers r when another replica serves its workflow (or nobody
// does right now); false lets the local handler answer.
func (h *Handler) routed(w http.ResponseWriter, r *http.Request) bool {
	if h.Owners == nil {
		return false
	}
	forwarded := r.Header.Get(ProxiedHeader) != ""
	ns, wf, a, ok := routeOf(r)
	if !ok || checkNames(ns, wf) != nil {
		return false // the handler answers (400, 404)
	}
	if wf == "" { // a listing of every workflow's sessions
		if forwarded {
			return false // this replica's part of a peer's listing
		}
		if !h.allowHTTP(w, r, a) {
			return true
		}
		h.listEverywhere(w, r, ns)
		return true
	}
	addr, bucket, err := h.Owners.Route(r.Context(), ns, wf)
	if err == nil && addr == "" {
		return false
	}
	if !h.allowHTTP(w, r, a) {
		return true
	}
	if err == nil && forwarded {
		err = errNotServedHere
	}
	if err != nil {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "%v: workflow %s/%s (engine bucket %s): %v", ErrEngineMoving, ns, wf, bucket, err)
		return true
	}
	proxyTo(addr).ServeHTTP(w, r)
	return true
}

// routeOf finds the workflow a request is about, and what authorizes it.
func routeOf(r *http.Request) (ns, wf string, a Attributes, ok bool) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/namespaces/"), "/")
	if !strings.HasPrefix(r.URL.Path, "/v1/namespaces/") || len(parts) < 2 {
		return "", "", a, false
	}
	ns = parts[0]
	switch {
	case r.Method == http.MethodPost && len(parts) == 4 && parts[1] == "workflows" && parts[3] == "sessions":
		return ns, parts[2], Attributes{Verb: "create", Namespace: ns, Workflow: parts[2]}, true
	case r.Method == http.MethodGet && len(parts) == 2 && parts[1] == "sessions":
		wf = r.URL.Query().Get("workflow")
		return ns, wf, Attributes{Verb: "list", Namespace: ns, Workflow: wf}, true
	case (r.Method == http.MethodGet && len(parts) >= 3 || r.Method == http.MethodDelete && len(parts) == 4 && parts[3] == "result") && parts[1] == "sessions":
		if wf = WorkflowOfSession(parts[2]); wf == "" {
			return "", "", a, false
		}
		// Authorized on the workflow the id names: whether the session
		// exists is for the owner to say, after its own check.
		return ns, wf, Attributes{Verb: "get", Namespace: ns, Workflow: wf}, true
	}
	return "", "", a, false
}

func proxyTo(addr string) *httputil.ReverseProxy {
	target := &url.URL{Scheme: "http", Host: addr}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set(ProxiedHeader, "1")
		},
		FlushInterval: -1, // events and results stream as they come
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "%v: the owner replica %s: %v", ErrEngineMoving, addr, err)
		},
	}
}

// listEverywhere answers a listing of a namespace's sessions with this
// replica's and every other owner's.
func (h *Handler) listEverywhere(w http.ResponseWriter, r *http.Request, ns string) {
	list := h.Sessions.List(ns, "")
	peers, err := h.Owners.Peers(r.Context())
	if err != nil {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "list the operator replicas: %v", err)
		return
	}
	for _, p := range peers {
		more, err := listAt(r, p)
		if err != nil {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "list the sessions of replica %s: %v", p, err)
			return
		}
		list = append(list, more...)
	}
	sessions.SortNewestFirst(list) // as one replica lists them
	if list == nil {
		list = []sessions.Session{}
	}
	writeJSON(w, http.StatusOK, list)
}

func listAt(r *http.Request, addr string) ([]sessions.Session, error) {
	u := url.URL{Scheme: "http", Host: addr, Path: r.URL.Path}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", r.Header.Get("Authorization"))
	req.Header.Set(ProxiedHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var list []sessions.Session
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, errors.New("not a list of sessions")
	}
	return list, nil
}
