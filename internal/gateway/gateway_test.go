package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ziptrail/ziptrail/internal/sessions"
)

// starter registers sessions in the registry, as the engine adapter does,
// and refuses unknown workflows.
type starter struct {
	reg *sessions.Registry
	n   int
}

func (s *starter) StartSession(_ context.Context, ns, wf string, input []byte) (string, error) {
	switch wf {
	case "missing":
		return "", fmt.Errorf("%w: %s/%s", ErrWorkflowNotFound, ns, wf)
	case "cold":
		return "", fmt.Errorf("%w: services not ready", ErrWorkflowNotReady)
	}
	s.n++
	id := fmt.Sprintf("s%d", s.n)
	return id, s.reg.Start(id, ns, wf)
}

type inlineResults struct{}

func (inlineResults) OpenResult(_ context.Context, _ string, r *sessions.Result) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(r.Inline)), nil
}

func TestGateway(t *testing.T) {
	reg := sessions.NewRegistry()
	srv := httptest.NewServer(New(&Handler{Starter: &starter{reg: reg}, Sessions: reg, Results: inlineResults{}, MaxInput: 16}))
	defer srv.Close()
	do := func(method, path, body string) (*http.Response, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}

	resp, body := do("POST", "/v1/namespaces/ns/workflows/wc/sessions", "input")
	if resp.StatusCode != 201 || resp.Header.Get("Location") != "/v1/namespaces/ns/sessions/s1" {
		t.Fatalf("start: %d %s", resp.StatusCode, body)
	}
	var s sessions.Session
	_ = json.Unmarshal([]byte(body), &s)
	if s.ID != "s1" || s.State != sessions.Running {
		t.Errorf("started: %+v", s)
	}
	for path, want := range map[string]int{
		"/v1/namespaces/ns/workflows/missing/sessions": 404,
		"/v1/namespaces/ns/workflows/cold/sessions":    409,
	} {
		if resp, body := do("POST", path, ""); resp.StatusCode != want || !strings.Contains(body, "error") {
			t.Errorf("POST %s: %d %s, want %d", path, resp.StatusCode, body, want)
		}
	}
	if resp, body := do("POST", "/v1/namespaces/ns/workflows/wc/sessions", strings.Repeat("x", 17)); resp.StatusCode != 413 {
		t.Errorf("oversized input: %d %s", resp.StatusCode, body)
	}

	// Not done yet: 202; another namespace cannot see it.
	if resp, _ := do("GET", "/v1/namespaces/ns/sessions/s1/result", ""); resp.StatusCode != 202 {
		t.Errorf("running result: %d", resp.StatusCode)
	}
	if resp, _ := do("GET", "/v1/namespaces/other/sessions/s1", ""); resp.StatusCode != 404 {
		t.Errorf("foreign namespace: %d", resp.StatusCode)
	}
	if resp, _ := do("GET", "/v1/namespaces/ns/sessions/s1/result?wait=soon", ""); resp.StatusCode != 400 {
		t.Errorf("bad wait: %d", resp.StatusCode)
	}

	// The events stream follows progress until the session ends.
	evResp, err := http.Get(srv.URL + "/v1/namespaces/ns/sessions/s1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer evResp.Body.Close()
	lines := bufio.NewScanner(evResp.Body)
	next := func() string {
		for lines.Scan() {
			if l := lines.Text(); strings.HasPrefix(l, "event: ") {
				return strings.TrimPrefix(l, "event: ")
			}
		}
		return ""
	}
	if e := next(); e != "Started" {
		t.Errorf("first event %q", e)
	}
	// A waiting result request returns as soon as the session completes.
	got := make(chan string)
	go func() {
		_, body := do("GET", "/v1/namespaces/ns/sessions/s1/result?wait=1m", "")
		got <- body
	}()
	reg.Log("s1", "Invoked", "map")
	if e := next(); e != "Invoked" {
		t.Errorf("second event %q", e)
	}
	_ = reg.Finish("s1", sessions.Completed, &sessions.Result{Bucket: "output", Key: "result", Size: 2, Inline: []byte("42")}, "")
	if e := next(); e != "Completed" {
		t.Errorf("last event %q", e)
	}
	if b := <-got; b != "42" {
		t.Errorf("result %q", b)
	}

	_, body = do("GET", "/v1/namespaces/ns/sessions?workflow=wc", "")
	var list []sessions.Session
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list) != 1 || list[0].State != sessions.Completed {
		t.Errorf("list: %s", body)
	}
	_, _ = do("POST", "/v1/namespaces/ns/workflows/wc/sessions", "")
	_ = reg.Finish("s2", sessions.Failed, nil, "reduce crashed 3 times")
	if resp, body := do("GET", "/v1/namespaces/ns/sessions/s2/result", ""); resp.StatusCode != 409 || !strings.Contains(body, "reduce crashed") {
		t.Errorf("failed session: %d %s", resp.StatusCode, body)
	}
}
