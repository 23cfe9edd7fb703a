package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/shuffle/plan"
)

const planPath = "/v1/namespaces/a/shuffle/plan"

// planAnswer decodes a plan answer.
func planAnswer(t *testing.T, body string) gateway.PlanAnswer {
	t.Helper()
	var a gateway.PlanAnswer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("plan answer %q: %v", body, err)
	}
	return a
}

// sameResult says whether the gateway planned what plan.Explain plans with
// cal for in.
func sameResult(t *testing.T, got plan.Result, cal model.Calibration, in plan.Input) {
	t.Helper()
	want, err := plan.Explain(cal, model.DefaultPrices(), in)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want.Result)
	if !bytes.Equal(g, w) {
		t.Errorf("the gateway's plan differs from plan.Explain's:\n got %s\nwant %s", g, w)
	}
}

// TestPlanShuffle plays users against the shuffle planner's route over HTTP
// and gRPC with real tokens, RBAC and ConfigMaps: strangers get 401, users
// without the session-runner role in the namespace (or with it in another)
// 403, careless requests 400 or 413 with what is wrong; a runner gets the
// plan, with the built-in defaults (calibrated false) until the operator's
// namespace holds a calibration ConfigMap, then with it.
func TestPlanShuffle(t *testing.T) {
	f := newFixture(t, nil)
	f.namespace(t, "a")
	f.namespace(t, "b")
	f.namespace(t, "ziptrail-system")
	f.h.Calibration = &gateway.ConfigMapCalibration{Reader: f.k8s, Namespace: "ziptrail-system", TTL: time.Nanosecond}
	runnerA := f.serviceAccount(t, "a", "runner", "a")
	nobodyA := f.serviceAccount(t, "a", "nobody", "")
	runnerB := f.serviceAccount(t, "b", "runner", "b")
	ctx := context.Background()
	good := `{"dataBytes": 4294967296, "fastCapacity": 1073741824, "maxWorkerMemory": 2147483648, "budget": 0.5}`
	in := plan.Input{DataBytes: 4 << 30, FastCapacity: 1 << 30, MaxWorkerMemory: 2 << 30, Budget: 0.5}

	// Strangers, even with a huge body (refused before it is read).
	for name, token := range map[string]string{"no token": "", "forged token": "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2ln"} {
		resp, body := f.do(t, token, http.MethodPost, planPath, strings.NewReader(good))
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" || !contains(body, `"error"`) {
			t.Errorf("%s: plan answered %d %s, want 401", name, resp.StatusCode, body)
		}
		resp, _ = f.do(t, token, http.MethodPost, planPath, bytes.NewReader(make([]byte, 32<<20)))
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s with 32 MiB: plan answered %d, want 401", name, resp.StatusCode)
		}
	}
	if _, err := f.gw.PlanShuffle(ctx, &gatewayv1.PlanShuffleRequest{Namespace: "a", RequestJson: []byte(good)}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("anonymous gRPC plan: %v, want Unauthenticated", err)
	}

	// Authenticated, without the role in a (none at all, or b's).
	for name, token := range map[string]string{"a:nobody": nobodyA, "b:runner": runnerB} {
		resp, body := f.do(t, token, http.MethodPost, planPath, strings.NewReader(good))
		if resp.StatusCode != http.StatusForbidden || !contains(body, "system:serviceaccount:"+name, "create", "ziptrail-session-runner") {
			t.Errorf("%s: plan in a answered %d %s, want 403 naming the user and the role", name, resp.StatusCode, body)
		}
		if _, err := f.gw.PlanShuffle(withToken(ctx, token), &gatewayv1.PlanShuffleRequest{Namespace: "a", RequestJson: []byte(good)}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: gRPC plan in a: %v, want PermissionDenied", name, err)
		}
	}

	// Careless requests of a runner.
	for _, c := range []struct {
		path, body string
		code       int
		want       string
	}{
		{planPath, `{"dataBytes": 4294967296,`, 400, "not valid JSON"},
		{planPath, `not json`, 400, "not valid JSON"},
		{planPath, ``, 400, "not valid JSON"},
		{planPath, `{"dataBytes": -1}`, 400, "data size must be positive"},
		{planPath, `{"dataBytes": 1e9, "methods": ["s3", "floppy"]}`, 400, `unknown method \"floppy\"`},
		{planPath, `{"dataBytes": 1e9, "budget": 1, "deadline": 60}`, 400, "not both"},
		{planPath, `{"dataBytes": 1e9, "objective": "fastest", "deadline": 60}`, 400, "deadline goes with the cheapest"},
		{planPath, `{"dataBytes": 1e9, "size": 1e9}`, 400, `unknown field \"size\"`},
		{planPath, `{"dataBytes": 1e9, "maxWorkerMemory": 1e6}`, 400, "worker memory limit"},
		{planPath, `{"dataBytes": 1e9, "prices": {"slowPerGet": -1}}`, 400, "prices"},
		{"/v1/namespaces/A_B/shuffle/plan", good, 400, "invalid namespace"},
		{planPath, `{"dataBytes": 1e9, "methods": ["` + strings.Repeat("s3", 64<<10) + `"]}`, 413, "exceeds the limit"},
	} {
		resp, body := f.do(t, runnerA, http.MethodPost, c.path, strings.NewReader(c.body))
		if resp.StatusCode != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%.60s: answered %d %s, want %d with %q", c.body, resp.StatusCode, body, c.code, c.want)
		}
	}
	// A huge body of unknown length (chunked) is cut off at the limit.
	resp, body := f.do(t, runnerA, http.MethodPost, planPath, io.MultiReader(strings.NewReader(`{"dataBytes": 1e9, "methods": ["`), endless{}))
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("endless body: answered %d %.200s, want 413", resp.StatusCode, body)
	}
	if _, err := f.gw.PlanShuffle(withToken(ctx, runnerA), &gatewayv1.PlanShuffleRequest{Namespace: "a", RequestJson: []byte(`{"dataBytes": -1}`)}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "data size") {
		t.Errorf("gRPC plan of a negative size: %v, want InvalidArgument with the reason", err)
	}

	// Uncalibrated: the built-in defaults, and it says so.
	resp, body = f.do(t, runnerA, http.MethodPost, planPath, strings.NewReader(good))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("runner of a: plan answered %d %s", resp.StatusCode, body)
	}
	a := planAnswer(t, body)
	if a.Calibrated || a.Warning != "" || a.Result.Chosen == nil || len(a.Result.Options) != len(model.Methods) {
		t.Errorf("uncalibrated plan: calibrated %v, warning %q, chosen %v, %d options", a.Calibrated, a.Warning, a.Result.Chosen, len(a.Result.Options))
	}
	sameResult(t, a.Result, model.DefaultCalibration(), in)

	// Calibrated: the ConfigMap `ziptrail calibrate --configmap` writes.
	cal := model.DefaultCalibration()
	cal.Time = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	cal.MeasuredOn = model.MeasuredOn{Kind: "cluster", Name: "test-cluster"}
	cal.Params.WorkerStartup *= 3 // different from the defaults, so the plan differs
	data, err := cal.ConfigMapData()
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ziptrail-system", Name: model.ConfigMapName}, Data: data}
	if err := f.k8s.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	resp, body = f.do(t, runnerA, http.MethodPost, planPath, strings.NewReader(good))
	a = planAnswer(t, body)
	if resp.StatusCode != http.StatusOK || !a.Calibrated || a.Calibration.MeasuredOn.Name != "test-cluster" || a.Warning != "" {
		t.Errorf("calibrated plan: %d, calibrated %v, measured on %q, warning %q", resp.StatusCode, a.Calibrated, a.Calibration.MeasuredOn.Name, a.Warning)
	}
	sameResult(t, a.Result, cal, in)
	g, err := f.gw.PlanShuffle(withToken(ctx, runnerA), &gatewayv1.PlanShuffleRequest{Namespace: "a", RequestJson: []byte(good)})
	if err != nil {
		t.Fatal(err)
	}
	if ga := planAnswer(t, string(g.ExplanationJson)); !ga.Calibrated {
		t.Errorf("gRPC plan: calibrated %v, want the ConfigMap's", ga.Calibrated)
	} else {
		sameResult(t, ga.Result, cal, in)
	}

	// A broken ConfigMap: the defaults, with a warning saying why.
	cm.Data = map[string]string{model.ConfigMapKey: `{"version": 99}`}
	if err := f.k8s.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	resp, body = f.do(t, runnerA, http.MethodPost, planPath, strings.NewReader(good))
	a = planAnswer(t, body)
	if resp.StatusCode != http.StatusOK || a.Calibrated || !strings.Contains(a.Warning, "not a valid calibration") {
		t.Errorf("broken ConfigMap: %d, calibrated %v, warning %q", resp.StatusCode, a.Calibrated, a.Warning)
	}
}

// endless is a body that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}
