package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// fuzzEnv is the gateway of a real control plane and engine with two
// namespaces: a (a runner and a ServiceAccount without the role) and b
// (a completed session whose data nobody of a may see).
type fuzzEnv struct {
	f                     *fixture
	runnerA, nobodyA      string
	sessionA, sessionB    string
	secretB               string // b's input and result
	tokens                []string
	knownCodes, okForNone []int
}

// fuzzKubeconfig names, for fuzzing workers, the control plane the
// coordinating process started: a worker uses it instead of starting its
// own, which it could not stop when the coordinator ends it.
const fuzzKubeconfig = "ZIPTRAIL_FUZZ_KUBECONFIG"

func newFuzzEnv(f *testing.F) *fuzzEnv {
	var fx *fixture
	if path := os.Getenv(fuzzKubeconfig); path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			f.Fatal(err)
		}
		fx = fixtureOn(f, cfg, nil)
	} else {
		fx = newFixture(f, nil)
		path, err := fx.env.Kubeconfig(f.TempDir())
		if err != nil {
			f.Fatal(err)
		}
		f.Setenv(fuzzKubeconfig, path)
	}
	fx.namespace(f, "a")
	fx.namespace(f, "b")
	e := &fuzzEnv{f: fx, secretB: "b-secret-7f3a9c"}
	e.runnerA = fx.serviceAccount(f, "a", "runner", "a")
	e.nobodyA = fx.serviceAccount(f, "a", "nobody", "")
	runnerB := fx.serviceAccount(f, "b", "runner", "b")
	fx.workflow(f, "a", "echo", echo)
	fx.workflow(f, "b", "echo", echo)
	run := func(token, ns, input string) string {
		resp, body := fx.do(f, token, http.MethodPost, "/v1/namespaces/"+ns+"/workflows/echo/sessions", strings.NewReader(input))
		var s sessions.Session
		if err := json.Unmarshal([]byte(body), &s); err != nil || resp.StatusCode != http.StatusCreated {
			f.Fatalf("start in %s: %d %s", ns, resp.StatusCode, body)
		}
		if resp, body := fx.do(f, token, http.MethodGet, "/v1/namespaces/"+ns+"/sessions/"+s.ID+"/result?wait=1m", nil); resp.StatusCode != http.StatusOK {
			f.Fatalf("result in %s: %d %s", ns, resp.StatusCode, body)
		}
		return s.ID
	}
	e.sessionB = run(runnerB, "b", e.secretB)
	e.sessionA = run(e.runnerA, "a", "a-input")
	return e
}

// token picks the credentials of a fuzzed request: none, a's runner, a's
// ServiceAccount without the role, or a fuzzed Authorization value.
func (e *fuzzEnv) auth(kind uint8, raw string) (header string, allowed bool) {
	switch kind % 4 {
	case 1:
		return "Bearer " + e.runnerA, true
	case 2:
		return "Bearer " + e.nobodyA, false
	case 3:
		return raw, false
	}
	return "", false
}

// FuzzGatewayRequest sends arbitrary HTTP requests (method, path and
// query, Authorization, body) to the gateway of a real API server and
// engine. Whatever arrives: no panic, a known status, a JSON error body;
// nothing succeeds without a token allowed by RBAC; nothing of namespace b
// leaks to a's users.
func FuzzGatewayRequest(f *testing.F) {
	e := newFuzzEnv(f)
	for _, s := range []struct {
		kind         uint8
		method, path string
		auth         string
		body         []byte
	}{
		{1, "POST", "/v1/namespaces/a/workflows/echo/sessions", "", []byte("hello")},
		{1, "GET", "/v1/namespaces/a/sessions", "", nil},
		{1, "GET", "/v1/namespaces/a/sessions?workflow=echo", "", nil},
		{1, "GET", "/v1/namespaces/a/sessions/" + e.sessionA, "", nil},
		{1, "GET", "/v1/namespaces/a/sessions/" + e.sessionA + "/result?wait=1s", "", nil},
		{1, "GET", "/v1/namespaces/a/sessions/" + e.sessionA + "/events", "", nil},
		{1, "GET", "/v1/namespaces/b/sessions/" + e.sessionB + "/result", "", nil},
		{1, "GET", "/v1/namespaces/a/sessions/" + e.sessionB, "", nil},
		{1, "POST", "/v1/namespaces/a/workflows/../sessions", "", nil},
		{1, "GET", "/v1/namespaces/a/sessions/x/result?wait=-1h", "", nil},
		{1, "POST", "/v1/namespaces/A_B/workflows/echo/sessions", "", nil},
		{2, "POST", "/v1/namespaces/a/workflows/echo/sessions", "", []byte("x")},
		{0, "GET", "/v1/namespaces/a/sessions", "", nil},
		{3, "GET", "/v1/namespaces/a/sessions", "Bearer ", nil},
		{3, "GET", "/v1/namespaces/a/sessions", "Basic YWRtaW46YWRtaW4=", nil},
		{3, "GET", "/v1/namespaces/b/sessions/" + e.sessionB, "bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhZG1pbiJ9.", nil},
		{1, "DELETE", "/v1/namespaces/a/sessions/" + e.sessionA, "", nil},
		{1, "GET", "/%2e%2e/v1/namespaces/b/sessions", "", nil},
	} {
		f.Add(s.kind, s.method, s.path, s.auth, s.body)
	}
	// 301/307: ServeMux sends unclean paths to their clean form.
	known := []int{200, 201, 202, 204, 301, 307, 308, 400, 401, 403, 404, 405, 409, 410, 411, 413, 503}
	f.Fuzz(func(t *testing.T, kind uint8, method, target, raw string, body []byte) {
		if !validMethod(method) || !strings.HasPrefix(target, "/") {
			return
		}
		u, err := url.ParseRequestURI(target)
		if err != nil {
			return
		}
		auth, allowed := e.auth(kind, raw)
		if strings.ContainsAny(auth, "\r\n\x00") || !utf8.ValidString(auth) {
			return // not a header value a client can send
		}
		// Bounds a request that would wait (?wait=, events of a running
		// session); not an assertion.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, "http://gateway"+u.RequestURI(), strings.NewReader(string(body)))
		if err != nil {
			return
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		e.f.h.ServeHTTP(rec, req)
		code, out := rec.Code, rec.Body.String()
		if !slices.Contains(known, code) {
			t.Fatalf("%s %s: status %d %s", method, target, code, out)
		}
		if code >= 400 && code != http.StatusMethodNotAllowed && !isJSONError(out) { // 405: ServeMux's own
			t.Fatalf("%s %s: %d with a body that is not a JSON error: %q", method, target, code, out)
		}
		if code < 300 && !allowed {
			t.Fatalf("%s %s without an allowed token (kind %d, %q): %d %s", method, target, kind%4, auth, code, out)
		}
		// b's session id may come back only as the caller sent it (in an
		// error naming what was not found).
		if strings.Contains(out, e.secretB) || strings.Contains(out, e.sessionB) && !strings.Contains(target, e.sessionB) {
			t.Fatalf("%s %s by a's user leaked namespace b: %d %s", method, target, code, out)
		}
	})
}

// FuzzGatewayGRPC sends arbitrary gRPC request messages to each method of
// the gateway's gRPC server, with fuzzed or real credentials.
func FuzzGatewayGRPC(f *testing.F) {
	e := newFuzzEnv(f)
	seed := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	f.Add(uint8(1), uint8(0), seed(&gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo", Input: []byte("x")}), "")
	f.Add(uint8(1), uint8(1), seed(&gatewayv1.SessionRef{Namespace: "a", Id: e.sessionA}), "")
	f.Add(uint8(1), uint8(2), seed(&gatewayv1.WaitSessionRequest{Namespace: "a", Id: e.sessionA, TimeoutMs: 10}), "")
	f.Add(uint8(1), uint8(3), seed(&gatewayv1.SessionRef{Namespace: "a", Id: e.sessionA}), "")
	f.Add(uint8(1), uint8(4), seed(&gatewayv1.SessionRef{Namespace: "a", Id: e.sessionA}), "")
	f.Add(uint8(1), uint8(1), seed(&gatewayv1.SessionRef{Namespace: "b", Id: e.sessionB}), "")
	f.Add(uint8(2), uint8(0), seed(&gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo"}), "")
	f.Add(uint8(3), uint8(1), seed(&gatewayv1.SessionRef{Namespace: "a", Id: e.sessionA}), "Bearer x")
	f.Add(uint8(1), uint8(0), []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, "")
	f.Fuzz(func(t *testing.T, kind, method uint8, msg []byte, raw string) {
		auth, allowed := e.auth(kind, raw)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", auth))
		var err error
		var leaked string
		switch method % 5 {
		case 0:
			req := &gatewayv1.StartSessionRequest{}
			if proto.Unmarshal(msg, req) != nil {
				return
			}
			var s *gatewayv1.Session
			if s, err = e.f.g.StartSession(ctx, req); s != nil {
				leaked = s.String()
			}
		case 1:
			req := &gatewayv1.SessionRef{}
			if proto.Unmarshal(msg, req) != nil {
				return
			}
			var s *gatewayv1.Session
			if s, err = e.f.g.GetSession(ctx, req); s != nil {
				leaked = s.String()
			}
		case 2:
			req := &gatewayv1.WaitSessionRequest{}
			if proto.Unmarshal(msg, req) != nil {
				return
			}
			var r *gatewayv1.SessionResult
			if r, err = e.f.g.WaitSession(ctx, req); r != nil {
				leaked = r.String() + string(r.GetResult())
			}
		case 3, 4:
			req := &gatewayv1.SessionRef{}
			if proto.Unmarshal(msg, req) != nil {
				return
			}
			if method%5 == 3 {
				st := &recordStream[gatewayv1.SessionEvent]{ctx: ctx}
				err = e.f.g.WatchSession(req, st)
				leaked = st.sent.String()
			} else {
				st := &recordStream[gatewayv1.ResultChunk]{ctx: ctx}
				err = e.f.g.ReadResult(req, st)
				leaked = st.sent.String()
			}
		}
		if err != nil {
			leaked += status.Convert(err).Message()
		}
		if err == nil && !allowed {
			t.Fatalf("method %d succeeded without an allowed token (kind %d)", method%5, kind%4)
		}
		if c := status.Code(err); err != nil && (c == codes.Unknown || c == codes.Internal) {
			t.Fatalf("method %d: %v", method%5, err)
		}
		if strings.Contains(leaked, e.secretB) || strings.Contains(leaked, e.sessionB) && !strings.Contains(string(msg), e.sessionB) {
			t.Fatalf("method %d leaked namespace b: %s", method%5, leaked)
		}
	})
}

// recordStream is the server side of a streaming call, recording what the
// gateway sends.
type recordStream[M any] struct {
	grpc.ServerStream
	ctx  context.Context
	sent strings.Builder
}

func (r *recordStream[M]) Context() context.Context { return r.ctx }

func (r *recordStream[M]) Send(m *M) error {
	fmt.Fprintf(&r.sent, "%v", m)
	if c, ok := any(m).(*gatewayv1.ResultChunk); ok {
		r.sent.Write(c.Data)
	}
	return nil
}

func isJSONError(body string) bool {
	var e struct {
		Error string `json:"error"`
	}
	return json.Unmarshal([]byte(body), &e) == nil && e.Error != ""
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for _, c := range m {
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", c) && !('0' <= c && c <= '9') && !('a' <= c && c <= 'z') && !('A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}
