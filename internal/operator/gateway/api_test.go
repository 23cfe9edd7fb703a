package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestHTTPAPI walks the HTTP API as an authorized user: start, progress
// events, a waiting result, listing, failures and the client errors.
func TestHTTPAPI(t *testing.T) {
	f := newFixture(t, nil)
	f.namespace(t, "ns")
	f.namespace(t, "other")
	token := f.serviceAccount(t, "ns", "runner", "ns")
	// Bound in other too: a session of ns is still not found there.
	f.bind(t, "ns", "runner", "other")
	release := make(chan struct{})
	f.workflow(t, "ns", "wc", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []byte("42"), nil
	}))
	f.workflow(t, "ns", "broken", ziptrail.FunctionHandler(func(context.Context, *ziptrail.Invocation) ([]byte, error) {
		return nil, errors.New("reduce crashed 3 times")
	}))
	cold := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cold"},
		Spec: v1alpha1.WorkflowSpec{Entry: "run", Functions: []v1alpha1.FunctionSpec{{Name: "run", Image: "example.com/run"}}}}
	if err := f.orch.SetWorkflow(cold, false, "services not ready"); err != nil {
		t.Fatal(err)
	}

	resp, body := f.do(t, token, http.MethodPost, "/v1/namespaces/ns/workflows/wc/sessions", strings.NewReader("input"))
	var s sessions.Session
	_ = json.Unmarshal([]byte(body), &s)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Location") != "/v1/namespaces/ns/sessions/"+s.ID || s.State != sessions.Running {
		t.Fatalf("start: %d %s", resp.StatusCode, body)
	}
	for path, want := range map[string]int{
		"/v1/namespaces/ns/workflows/missing/sessions":  http.StatusNotFound,
		"/v1/namespaces/ns/workflows/cold/sessions":     http.StatusConflict,
		"/v1/namespaces/NS!/workflows/wc/sessions":      http.StatusBadRequest,
		"/v1/namespaces/ns/workflows/Bad_Name/sessions": http.StatusBadRequest,
	} {
		if resp, body := f.do(t, token, http.MethodPost, path, strings.NewReader("")); resp.StatusCode != want || !strings.Contains(body, `"error"`) {
			t.Errorf("POST %s: %d %s, want %d", path, resp.StatusCode, body, want)
		}
	}
	if resp, body := f.do(t, token, http.MethodDelete, "/v1/namespaces/ns/sessions/"+s.ID, nil); resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusNotFound {
		t.Errorf("DELETE: %d %s", resp.StatusCode, body)
	}

	// Not done yet: 202; another namespace does not have it.
	if resp, _ := f.do(t, token, http.MethodGet, "/v1/namespaces/ns/sessions/"+s.ID+"/result", nil); resp.StatusCode != http.StatusAccepted {
		t.Errorf("running result: %d", resp.StatusCode)
	}
	if resp, _ := f.do(t, token, http.MethodGet, "/v1/namespaces/other/sessions/"+s.ID, nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("session looked up in another namespace: %d", resp.StatusCode)
	}
	if resp, _ := f.do(t, token, http.MethodGet, "/v1/namespaces/ns/sessions/"+s.ID+"/result?wait=soon", nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad wait: %d", resp.StatusCode)
	}

	// The events stream follows progress until the session ends.
	req, _ := http.NewRequest(http.MethodGet, f.url+"/v1/namespaces/ns/sessions/"+s.ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	evResp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer evResp.Body.Close()
	var kinds []string
	streamed := make(chan struct{})
	go func() {
		defer close(streamed)
		lines := bufio.NewScanner(evResp.Body)
		for lines.Scan() {
			if k, ok := strings.CutPrefix(lines.Text(), "event: "); ok {
				kinds = append(kinds, k)
			}
		}
	}()
	// A waiting result request returns as soon as the session completes.
	got := make(chan string)
	go func() {
		_, body := f.do(t, token, http.MethodGet, "/v1/namespaces/ns/sessions/"+s.ID+"/result?wait=1m", nil)
		got <- body
	}()
	close(release)
	if b := <-got; b != "42" {
		t.Errorf("result %q", b)
	}
	<-streamed
	if len(kinds) < 3 || kinds[0] != "Started" || kinds[1] != "Invoked" || kinds[len(kinds)-1] != "Completed" {
		t.Errorf("events %v", kinds)
	}

	_, body = f.do(t, token, http.MethodGet, "/v1/namespaces/ns/sessions?workflow=wc", nil)
	var list []sessions.Session
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list) != 1 || list[0].State != sessions.Completed {
		t.Errorf("list: %s", body)
	}
	if _, body := f.do(t, token, http.MethodGet, "/v1/namespaces/other/sessions", nil); strings.TrimSpace(body) != "[]" {
		t.Errorf("empty list: %s", body)
	}
	_, body = f.do(t, token, http.MethodPost, "/v1/namespaces/ns/workflows/broken/sessions", strings.NewReader("x"))
	_ = json.Unmarshal([]byte(body), &s)
	if resp, body := f.do(t, token, http.MethodGet, "/v1/namespaces/ns/sessions/"+s.ID+"/result?wait=1m", nil); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "reduce crashed") {
		t.Errorf("failed session: %d %s", resp.StatusCode, body)
	}
}

// TestGRPCAPI: the same over gRPC.
func TestGRPCAPI(t *testing.T) {
	f := newFixture(t, nil)
	f.namespace(t, "ns")
	token := f.serviceAccount(t, "ns", "runner", "ns")
	release := make(chan struct{})
	f.workflow(t, "ns", "wc", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		<-release
		return []byte("42"), nil
	}))
	cold := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cold"},
		Spec: v1alpha1.WorkflowSpec{Entry: "run", Functions: []v1alpha1.FunctionSpec{{Name: "run", Image: "example.com/run"}}}}
	if err := f.orch.SetWorkflow(cold, false, "services not ready"); err != nil {
		t.Fatal(err)
	}
	ctx := withToken(context.Background(), token)

	if _, err := f.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "ns", Workflow: "missing"}); status.Code(err) != codes.NotFound {
		t.Errorf("missing workflow: %v", err)
	}
	if _, err := f.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "ns", Workflow: "cold"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("cold workflow: %v", err)
	}
	if _, err := f.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "ns", Workflow: "wc", Input: make([]byte, maxInput+1)}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("input over the limit: %v", err)
	}
	s, err := f.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "ns", Workflow: "wc", Input: []byte("in")})
	if err != nil || s.State != "Running" {
		t.Fatalf("%v %v", s, err)
	}
	if _, err := f.gw.GetSession(ctx, &gatewayv1.SessionRef{Namespace: "ns", Id: "no-such-session"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown session: %v", err)
	}
	watch, err := f.gw.WatchSession(ctx, &gatewayv1.SessionRef{Namespace: "ns", Id: s.Id})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := watch.Recv(); err != nil || e.Kind != "Started" {
		t.Fatalf("first event %v %v", e, err)
	}
	st, err := f.gw.ReadResult(ctx, &gatewayv1.SessionRef{Namespace: "ns", Id: s.Id})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ReadResult of a running session: %v, want FailedPrecondition", err)
	}
	done := make(chan *gatewayv1.SessionResult)
	go func() {
		r, err := f.gw.WaitSession(ctx, &gatewayv1.WaitSessionRequest{Namespace: "ns", Id: s.Id, TimeoutMs: 60_000})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	close(release)
	r := <-done
	if r.GetSession().GetState() != "Completed" || string(r.GetResult()) != "42" || r.GetSession().GetResultBucket() != "output" {
		t.Errorf("result %v", r)
	}
	var kinds []string
	for {
		e, err := watch.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, e.Kind)
	}
	if len(kinds) == 0 || kinds[len(kinds)-1] != "Completed" {
		t.Errorf("events after start: %v", kinds)
	}
}
