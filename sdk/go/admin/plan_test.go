package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/shuffle/plan"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// testPlan: Plan through a real gateway (gRPC, TokenReview and
// SubjectAccessReview against envtest) answers what the planner plans,
// with the defaults until the operator's namespace holds a calibration
// ConfigMap and with it after; the planner's refusals are KindInvalid,
// a user without the role is refused.
func testPlan(t *testing.T, env *envtest.Env, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k8s, err := client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	sys := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "operator-"}}
	if err := k8s.Create(ctx, sys); err != nil {
		t.Fatal(err)
	}
	g := &gateway.GRPC{H: gateway.New(&gateway.Handler{Auth: &gateway.KubeAuth{Client: k8s},
		Calibration: &gateway.ConfigMapCalibration{Reader: k8s, Namespace: sys.Name, TTL: time.Nanosecond}})}
	gs := grpc.NewServer(g.ServerOptions()...)
	gatewayv1.RegisterGatewayServer(gs, g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	devConfig, _ := userConfig(t, k8s, env, ns, "planner", true)
	c, err := New(devConfig, Options{Namespace: ns, Gateway: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := PlanRequest{Size: 4 << 30, FastCapacity: 1 << 30, MaxWorkerMemory: 2 << 30, Deadline: 10 * time.Minute, Prices: map[string]float64{"slowPerPut": 0.00001}}
	in := plan.Input{DataBytes: 4 << 30, FastCapacity: 1 << 30, MaxWorkerMemory: 2 << 30, Deadline: 600}
	prices := model.DefaultPrices()
	prices.SlowPerPut = 0.00001

	check := func(p *Plan, cal model.Calibration) {
		t.Helper()
		want, err := plan.Explain(cal, prices, in)
		if err != nil {
			t.Fatal(err)
		}
		if p.Calibrated != cal.Calibrated() || want.Result.Chosen == nil || p.Chosen == nil {
			t.Fatalf("calibrated %v (want %v), chosen %+v (want %+v)", p.Calibrated, cal.Calibrated(), p.Chosen, want.Result.Chosen)
		}
		w := want.Result.Chosen
		got := *p.Chosen
		if got.Method != string(w.Config.Method) || got.Parallelism != w.Config.Parallelism || got.WorkerMemory != int64(w.Config.WorkerMemory) ||
			got.Rounds != w.Rounds || got.Seconds != w.Seconds || got.Dollars != w.Cost || !got.MeetsConstraint {
			t.Errorf("chosen %+v, want the planner's %+v", got, w)
		}
		if len(p.Alternatives) != len(model.Methods) {
			t.Errorf("%d alternatives, want every method", len(p.Alternatives))
		}
		var doc plan.Explanation
		if err := json.Unmarshal(p.Document, &doc); err != nil || doc.Result.Input.Objective != plan.Cheapest || doc.Prices.SlowPerPut != 0.00001 {
			t.Errorf("document: %v, objective %q, slowPerPut %v", err, doc.Result.Input.Objective, doc.Prices.SlowPerPut)
		}
	}

	p, err := c.Plan(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	check(p, model.DefaultCalibration())

	cal := model.DefaultCalibration()
	cal.Time = time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	cal.MeasuredOn = model.MeasuredOn{Kind: "cluster", Name: "sdk-test"}
	cal.Params.WorkerStartup *= 2
	data, err := cal.ConfigMapData()
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: sys.Name, Name: model.ConfigMapName}, Data: data}); err != nil {
		t.Fatal(err)
	}
	if p, err = c.Plan(ctx, req); err != nil {
		t.Fatal(err)
	}
	check(p, cal)

	for _, bad := range []struct {
		req  PlanRequest
		want string
	}{
		{PlanRequest{Size: -1}, "data size must be positive"},
		{PlanRequest{Size: 1 << 30, Methods: []string{"tape"}}, `unknown method "tape"`},
		{PlanRequest{Size: 1 << 30, Budget: 1, Deadline: time.Minute}, "not both"},
		{PlanRequest{Size: 1 << 30, Prices: map[string]float64{"gold": 1}}, "unknown field"},
	} {
		if _, err := c.Plan(ctx, bad.req); !errors.Is(err, ziptrail.ErrInvalid) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want invalid with %q", bad.req, err, bad.want)
		}
	}

	// Without the right to run sessions in the namespace.
	outsider, _ := userConfig(t, k8s, env, sys.Name, "outsider", false)
	o, err := New(outsider, Options{Namespace: ns, Gateway: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := o.Plan(ctx, req); err == nil || !strings.Contains(err.Error(), "ziptrail-session-runner") {
		t.Errorf("a user without the role: %v, want refused naming the role", err)
	}
}
