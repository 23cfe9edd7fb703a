package admin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestAdmin runs the admin client against a real kube-apiserver and etcd
// (envtest, with the repository's CRDs) and a real session gateway over
// gRPC, driven by the operator's orchestrator and trigger engine, whose
// functions are Go SDK function servers.
func TestAdmin(t *testing.T) {
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	boot, err := New(env.Config, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "sdk-"}}
	if err := boot.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}

	t.Run("resources", func(t *testing.T) { testResources(t, env, ns.Name) })
	t.Run("sessions", func(t *testing.T) { testSessions(t, env, ns.Name) })
	t.Run("plan", func(t *testing.T) { testPlan(t, env, ns.Name) })
}

// testResources: create, read, apply, update and delete each kind; the
// API server's validation and conflicts come back as typed errors.
func testResources(t *testing.T, env *envtest.Env, ns string) {
	ctx := context.Background()
	c, err := New(env.Config, Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	b := &v1alpha1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "chunks"}, Spec: v1alpha1.BucketSpec{GCPolicy: v1alpha1.GCOnRead}}
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	if b.Namespace != ns {
		t.Errorf("namespace not defaulted: %q", b.Namespace)
	}
	got, err := c.Bucket(ctx, "chunks")
	if err != nil || got.Spec.GCPolicy != v1alpha1.GCOnRead || got.Spec.InlineThreshold == nil {
		t.Fatalf("read back (with CRD defaults): %+v %v", got, err)
	}
	if err := c.Create(ctx, &v1alpha1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "chunks"}}); !errors.Is(err, ziptrail.ErrConflict) || !apierrors.IsAlreadyExists(err) {
		t.Errorf("second create: %v", err)
	}
	// Apply replaces the spec of an existing object.
	if err := c.Apply(ctx, &v1alpha1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "chunks"}, Spec: v1alpha1.BucketSpec{GCPolicy: v1alpha1.GCRetain}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Bucket(ctx, "chunks"); got.Spec.GCPolicy != v1alpha1.GCRetain {
		t.Errorf("after apply: %s", got.Spec.GCPolicy)
	}
	// An update from a stale read conflicts.
	if err := c.Update(ctx, got); !errors.Is(err, ziptrail.ErrConflict) {
		t.Errorf("stale update: %v", err)
	}

	trig := &v1alpha1.Trigger{ObjectMeta: metav1.ObjectMeta{Name: "on-chunk"},
		Spec: v1alpha1.TriggerSpec{Bucket: "chunks", Primitive: v1alpha1.Immediate, Targets: []string{"count"}}}
	if err := c.Apply(ctx, trig); err != nil {
		t.Fatal(err)
	}
	trig.Spec.Targets = []string{"count", "audit"}
	if err := c.Update(ctx, trig); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Trigger(ctx, "on-chunk"); err != nil || len(got.Spec.Targets) != 2 {
		t.Errorf("trigger after update: %+v %v", got, err)
	}
	bad := &v1alpha1.Trigger{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: v1alpha1.TriggerSpec{Bucket: "chunks", Primitive: v1alpha1.Immediate, Targets: []string{"count"},
			BySet: &v1alpha1.BySetParams{Keys: []string{"a"}}}}
	if err := c.Create(ctx, bad); !errors.Is(err, ziptrail.ErrInvalid) || !strings.Contains(err.Error(), "bySet is only valid with primitive BySet") {
		t.Errorf("invalid trigger: %v", err)
	}

	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "chain"}, Spec: v1alpha1.WorkflowSpec{Entry: "a",
		Functions: []v1alpha1.FunctionSpec{{Name: "a", Image: "example.com/a"}}}}
	if err := c.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Workflow(ctx, "chain"); err != nil || got.Spec.Entry != "a" {
		t.Errorf("workflow: %+v %v", got, err)
	}

	if err := c.Delete(ctx, &v1alpha1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "chunks"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, trig); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bucket(ctx, "chunks"); !errors.Is(err, ziptrail.ErrNotFound) || !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), "Bucket "+ns+"/chunks") {
		t.Errorf("deleted bucket: %v", err)
	}
	if _, err := c.Trigger(ctx, "on-chunk"); !errors.Is(err, ziptrail.ErrNotFound) {
		t.Errorf("deleted trigger: %v", err)
	}
}

// testSessions: a word count through the real engine — map groups words
// with the SDK's group metadata (DynamicGroup), declares the expected
// counts with its expected-set metadata (DynamicJoin) — started, watched
// and awaited through the gateway; a failing function fails its session;
// an unknown workflow is not found.
func testSessions(t *testing.T, env *envtest.Env, ns string) {
	// A bound so that a session that never completes fails the test
	// instead of hanging it; far above what the sessions need.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fns := &servers.Functions{}
	fns.Add(t, "wc-map", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		words := strings.Fields(string(inv.Objects[0].Bytes()))
		for i, w := range words {
			if err := ziptrail.CreateObject("pairs", fmt.Sprint(i)).SetData([]byte(w)).SetGroup(w).Send(ctx, false); err != nil {
				return nil, err
			}
		}
		distinct := slices.Compact(slices.Sorted(slices.Values(words)))
		return nil, ziptrail.CreateObject("counts", "plan").ExpectKeys(distinct...).DeclareOnly().Send(ctx, false)
	}))
	fns.Add(t, "wc-reduce", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		return nil, ziptrail.CreateObject("counts", inv.Group).SetData(fmt.Appendf(nil, "%s=%d", inv.Group, len(inv.Objects))).Send(ctx, false)
	}))
	fns.Add(t, "wc-total", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		var parts []string
		for _, o := range inv.Objects {
			parts = append(parts, string(o.Bytes()))
		}
		sort.Strings(parts)
		return nil, ziptrail.SendObject(ctx, "output", "result", []byte(strings.Join(parts, ",")), nil)
	}))
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
	fns.Add(t, "big-make", ziptrail.FunctionHandler(func(context.Context, *ziptrail.Invocation) ([]byte, error) {
		return big, nil
	}))
	fns.Add(t, "broken-boom", ziptrail.FunctionHandler(func(context.Context, *ziptrail.Invocation) ([]byte, error) {
		return nil, errors.New("boom: the input is not a number")
	}))

	orch, err := orchestrator.New(orchestrator.Options{Resolver: fns, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	octx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- orch.Run(octx) }()
	t.Cleanup(func() { stop(); <-done })
	k8s, err := client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	g := &gateway.GRPC{H: gateway.New(&gateway.Handler{Starter: orch, Sessions: orch.Sessions(), Results: orch.Results(), Auth: &gateway.KubeAuth{Client: k8s}})}
	gs := grpc.NewServer(g.ServerOptions()...)
	gatewayv1.RegisterGatewayServer(gs, g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	// A user of the namespace: a kubeconfig with a ServiceAccount's token,
	// allowed to manage the namespace's workflows and run their sessions.
	devConfig, devToken := userConfig(t, k8s, env, ns, "dev", true)
	c, err := New(devConfig, Options{Namespace: ns, Gateway: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	image := func(names ...string) []v1alpha1.FunctionSpec {
		var out []v1alpha1.FunctionSpec
		for _, n := range names {
			out = append(out, v1alpha1.FunctionSpec{Name: n, Image: "example.com/" + n})
		}
		return out
	}
	workflows := []*v1alpha1.Workflow{
		{ObjectMeta: metav1.ObjectMeta{Name: "wc"}, Spec: v1alpha1.WorkflowSpec{Entry: "map", Functions: image("map", "reduce", "total"),
			Triggers: []v1alpha1.NamedTrigger{
				{Name: "shuffle", Spec: v1alpha1.TriggerSpec{Bucket: "pairs", Primitive: v1alpha1.DynamicGroup, Targets: []string{"reduce"},
					DynamicGroup: &v1alpha1.DynamicGroupParams{Sources: []string{"map"}}}},
				{Name: "collect", Spec: v1alpha1.TriggerSpec{Bucket: "counts", Primitive: v1alpha1.DynamicJoin, Targets: []string{"total"},
					DynamicJoin: &v1alpha1.DynamicJoinParams{}}},
			}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "broken"}, Spec: v1alpha1.WorkflowSpec{Entry: "boom", Functions: image("boom")}},
		{ObjectMeta: metav1.ObjectMeta{Name: "big"}, Spec: v1alpha1.WorkflowSpec{Entry: "make", Functions: image("make")}},
	}
	for _, wf := range workflows {
		if err := c.Apply(ctx, wf); err != nil {
			t.Fatal(err)
		}
		// As the Workflow reconciler does once its Services are ready: the
		// stored object, with the API server's defaults (groupMetadataKey).
		stored, err := c.Workflow(ctx, wf.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := orch.SetWorkflow(stored, true, ""); err != nil {
			t.Fatal(err)
		}
	}

	s, err := c.StartSession(ctx, "wc", []byte("a b a c b a"))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	watched := make(chan error, 1)
	go func() {
		for e, err := range c.Watch(ctx, s.ID) {
			if err != nil {
				watched <- err
				return
			}
			kinds = append(kinds, e.Kind)
		}
		watched <- nil
	}()
	res, err := c.Wait(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Output) != "a=3,b=2,c=1" || res.Session.State != Completed || res.Session.ResultBucket != "output" || !res.Session.Done() {
		t.Errorf("result %q, session %+v", res.Output, res.Session)
	}
	if err := <-watched; err != nil {
		t.Fatal(err)
	}
	if len(kinds) < 3 || kinds[0] != "Started" || kinds[len(kinds)-1] != "Completed" || !slices.Contains(kinds, "Invoked") {
		t.Errorf("progress events %v", kinds)
	}
	if got, err := c.GetSession(ctx, s.ID); err != nil || got.State != Completed || got.Invocations != 1+3+1 {
		t.Errorf("session after completion: %+v %v (want 5 invocations: map, 3 reduce, total)", got, err)
	}

	res, err = c.RunSession(ctx, "broken", []byte("x"))
	if !errors.Is(err, ziptrail.ErrFunctionFailed) || !strings.Contains(err.Error(), "boom: the input is not a number") || res.Session.State != Failed {
		t.Errorf("failing workflow: %v", err)
	}
	if _, err := c.RunSession(ctx, "missing", nil); !errors.Is(err, ziptrail.ErrNotFound) {
		t.Errorf("unknown workflow: %v", err)
	}
	if _, err := c.GetSession(ctx, "no-such-session"); !errors.Is(err, ziptrail.ErrNotFound) {
		t.Errorf("unknown session: %v", err)
	}
	// A result over 1 MiB streams (Wait reads it whole, OpenResult as a
	// stream).
	res, err = c.RunSession(ctx, "big", nil)
	if err != nil || !bytes.Equal(res.Output, big) || res.Session.ResultSize != int64(len(big)) {
		t.Fatalf("3 MiB result: %+v, %v", res.Session, err)
	}
	s, err = c.StartSession(ctx, "big", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range c.Watch(ctx, s.ID) {
		if err != nil {
			t.Fatal(err)
		}
	}
	rd, err := c.OpenResult(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	streamed, err := io.ReadAll(rd)
	rd.Close()
	if err != nil || !bytes.Equal(streamed, big) {
		t.Errorf("OpenResult: %d bytes, %v", len(streamed), err)
	}

	// Credentials: a user without the session role is refused with the
	// reason; a client-certificate kubeconfig has no token to send.
	guestConfig, _ := userConfig(t, k8s, env, ns, "guest", false)
	guest, err := New(guestConfig, Options{Namespace: ns, Gateway: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	if _, err := guest.StartSession(ctx, "wc", nil); !errors.Is(err, ziptrail.ErrUnavailable) || !strings.Contains(err.Error(), "ziptrail-session-runner") {
		t.Errorf("user without the role: %v", err)
	}
	certUser, err := New(env.Config, Options{Namespace: ns, Gateway: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer certUser.Close()
	if _, err := certUser.GetSession(ctx, s.ID); err == nil || !strings.Contains(err.Error(), "no bearer token") {
		t.Errorf("client-certificate kubeconfig: %v", err)
	}
	byToken, err := New(env.Config, Options{Namespace: ns, Gateway: ln.Addr().String(), GatewayToken: devToken})
	if err != nil {
		t.Fatal(err)
	}
	defer byToken.Close()
	if got, err := byToken.GetSession(ctx, s.ID); err != nil || got.State != Completed {
		t.Errorf("GatewayToken: %+v %v", got, err)
	}

	noGateway, _ := New(env.Config, Options{Namespace: ns})
	if _, err := noGateway.StartSession(ctx, "wc", nil); !errors.Is(err, ziptrail.ErrInvalid) {
		t.Errorf("without a gateway: %v", err)
	}
}

// userConfig is the REST config of a user of ns: a ServiceAccount's token
// and no client certificate, as in a user's kubeconfig. An admin may do
// anything in ns (sessions included); others nothing.
func userConfig(t *testing.T, k8s client.Client, env *envtest.Env, ns, name string, admin bool) (*rest.Config, string) {
	t.Helper()
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
		t.Fatal(err)
	}
	if admin {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-admin"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}}
		if err := k8s.Create(ctx, rb); err != nil {
			t.Fatal(err)
		}
	}
	tr := &authv1.TokenRequest{}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := k8s.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatal(err)
	}
	return &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: tr.Status.Token}, tr.Status.Token
}
