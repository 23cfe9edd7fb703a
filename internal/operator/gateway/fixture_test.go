package gateway_test

import (
	"cmp"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/dataplane/sidecar"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard/guardtest"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// fixture is a real control plane (kube-apiserver + etcd with RBAC), the
// operator's orchestrator driving the trigger engine, workflow functions
// on loopback, and the session gateway over HTTP and gRPC, wired as the
// operator wires them.
type fixture struct {
	env  *envtest.Env
	keys *control.SecretKeys
	k8s  client.Client
	cs   kubernetes.Interface
	orch *orchestrator.Orchestrator
	fns  *servers.Functions
	url  string // HTTP gateway
	gw   gatewayv1.GatewayClient
	h    *gateway.Handler // the gateway itself
	g    *gateway.GRPC

	controlAddr string
	grpcAddr    string // gRPC gateway
	// grpcRead counts the bytes the gRPC gateway read from its
	// connections.
	grpcRead *guardtest.CountingListener
	// grpcLimits, set by newFixture's configure, are the gRPC gateway's
	// limits (zero: its defaults).
	grpcLimits guard.Limits
	// maxInput, set by newFixture's configure, is the gateway's input
	// limit (zero: the const maxInput).
	maxInput int64
}

// newFixture starts everything; configure, when set, completes the
// orchestrator's options.
func newFixture(t testing.TB, configure func(*fixture, *orchestrator.Options)) *fixture {
	t.Helper()
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	f := fixtureOn(t, env.Config, configure)
	f.env = env
	return f
}

// fixtureOn starts everything but the control plane, which cfg reaches
// (as an admin); objects that exist already are reused.
func fixtureOn(t testing.TB, cfg *rest.Config, configure func(*fixture, *orchestrator.Options)) *fixture {
	t.Helper()
	ctrllog.SetLogger(logr.Discard())
	f := &fixture{fns: &servers.Functions{}}
	var err error
	if f.k8s, err = client.New(cfg, client.Options{Scheme: envtest.Scheme()}); err != nil {
		t.Fatal(err)
	}
	if f.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	// The ClusterRole the chart ships for users.
	data, err := os.ReadFile(filepath.Join(paths.RepoRoot(), "charts", "ziptrail", "files", "session-runner-role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(data, &role); err != nil {
		t.Fatal(err)
	}
	if err := client.IgnoreAlreadyExists(f.k8s.Create(context.Background(), &role)); err != nil {
		t.Fatal(err)
	}

	f.keys = &control.SecretKeys{Client: f.k8s}
	var orchOpts orchestrator.Options
	if configure != nil {
		configure(f, &orchOpts)
	}
	orchOpts.Resolver, orchOpts.Log, orchOpts.Keys = f.fns, logr.Discard(), f.keys
	if f.orch, err = orchestrator.New(orchOpts); err != nil {
		t.Fatal(err)
	}
	// The control stream, for sidecars (their keys, objects, drops),
	// authenticating their pods' tokens as cmd/operator does.
	ctl := control.NewServer(f.orch, f.keys)
	ctl.Auth = &control.TokenReviewer{Client: f.k8s}
	f.orch.SetControl(ctl)
	cs := grpc.NewServer(ctl.ServerOptions()...)
	controlv1.RegisterControlServer(cs, ctl)
	cl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = cs.Serve(ctl.Listener(cl)) }()
	t.Cleanup(cs.Stop)
	f.controlAddr = cl.Addr().String()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.orch.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })

	h := newGateway(f)
	f.h = h
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	g := &gateway.GRPC{H: h, Limits: f.grpcLimits}
	f.g = g
	gs := grpc.NewServer(g.ServerOptions()...)
	gatewayv1.RegisterGatewayServer(gs, g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.grpcRead = &guardtest.CountingListener{Listener: ln}
	go func() { _ = gs.Serve(g.Listener(f.grpcRead)) }()
	t.Cleanup(gs.Stop)
	f.grpcAddr = ln.Addr().String()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	f.gw = gatewayv1.NewGatewayClient(cc)
	return f
}

// newGateway builds the gateway as cmd/operator does.
func newGateway(f *fixture) *gateway.Handler {
	return gateway.New(&gateway.Handler{Starter: f.orch, Sessions: f.orch.Sessions(), Results: f.orch.Results(), Auth: &gateway.KubeAuth{Client: f.k8s}, MaxInput: cmp.Or(f.maxInput, maxInput)})
}

// maxInput is the gateway's input limit in these tests.
const maxInput = 8 << 20

// sidecarFunction serves a one-function workflow whose function is handler
// (a Go SDK function server) behind a real sidecar (queue-proxy-zl's data
// plane, in process) connected to the operator's control stream.
func (f *fixture) sidecarFunction(t testing.TB, ns, wf string, handler ziptrail.Handler) *sidecar.Sidecar {
	t.Helper()
	sc := f.sidecar(t, ns, wf, "run", handler)
	f.load(t, &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: wf},
		Spec: v1alpha1.WorkflowSpec{Entry: "run", Functions: []v1alpha1.FunctionSpec{{Name: "run", Image: "example.com/run"}}}})
	return sc
}

// sidecar serves function fn of workflow wf (a Go SDK function server)
// behind a real sidecar (queue-proxy-zl's data plane, in process)
// connected to the operator's control stream.
func (f *fixture) sidecar(t testing.TB, ns, wf, fn string, handler ziptrail.Handler) *sidecar.Sidecar {
	t.Helper()
	shm := t.TempDir()
	t.Setenv("ZIPTRAIL_SHM_DIR", shm) // where FunctionHandler accepts inputs from
	pod := wf + "-" + fn + "-pod"
	sc := sidecar.New(sidecar.Config{Namespace: ns, Workflow: wf, Function: wf + "-" + fn, Pod: pod, PodIP: "127.0.0.1",
		DataplanePort: servers.FreePort(t), ShmDir: shm, MemoryLimit: 64 << 20, InlineThreshold: 64 << 10,
		ObjectTTL: time.Minute, OperatorAddr: f.controlAddr, TokenFile: f.podToken(t, ns, pod)})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := sc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.fns.Add(t, wf+"-"+fn, sc.Wrap(ziptrail.FunctionHandler(handler)))
	return sc
}

// podToken creates pod ns/name (ServiceAccount ziptrail-fn) and writes the
// token the kubelet would project into it for the control stream's
// audience to a file, whose path it returns.
func (f *fixture) podToken(t testing.TB, ns, name string) string {
	t.Helper()
	ctx := context.Background()
	f.namespace(t, ns)
	if err := client.IgnoreAlreadyExists(f.k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ziptrail-fn"}})); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{ServiceAccountName: "ziptrail-fn", Containers: []corev1.Container{{Name: "user-container", Image: "example.com/fn"}}}}
	if err := f.k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	tr, err := f.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "ziptrail-fn", &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		Audiences: []string{control.Audience}, BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// load loads a workflow, as the Workflow reconciler does once its
// Services are ready.
func (f *fixture) load(t testing.TB, wf *v1alpha1.Workflow) {
	t.Helper()
	if err := f.orch.SetWorkflow(wf, true, ""); err != nil {
		t.Fatal(err)
	}
}

// namespace creates a namespace.
func (f *fixture) namespace(t testing.TB, name string) {
	t.Helper()
	if err := client.IgnoreAlreadyExists(f.k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})); err != nil {
		t.Fatal(err)
	}
}

// serviceAccount creates a ServiceAccount, binds it to the session-runner
// ClusterRole in bindIn (none when empty) and returns a token for it.
func (f *fixture) serviceAccount(t testing.TB, ns, name, bindIn string) string {
	t.Helper()
	ctx := context.Background()
	if err := client.IgnoreAlreadyExists(f.k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})); err != nil {
		t.Fatal(err)
	}
	if bindIn != "" {
		f.bind(t, ns, name, bindIn)
	}
	tr, err := f.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// bind binds a ServiceAccount to the session-runner ClusterRole in a
// namespace.
func (f *fixture) bind(t testing.TB, ns, name, in string) {
	t.Helper()
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: in, Name: ns + "-" + name + "-sessions"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ziptrail-session-runner"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}}
	if err := client.IgnoreAlreadyExists(f.k8s.Create(context.Background(), rb)); err != nil {
		t.Fatal(err)
	}
}

// workflow loads a one-function workflow whose function is h, as the
// Workflow reconciler does once its Service is ready.
func (f *fixture) workflow(t testing.TB, ns, name string, h http.Handler) {
	t.Helper()
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.WorkflowSpec{Entry: "run", Functions: []v1alpha1.FunctionSpec{{Name: "run", Image: "example.com/run"}}}}
	f.fns.Add(t, name+"-run", h)
	if err := f.orch.SetWorkflow(wf, true, ""); err != nil {
		t.Fatal(err)
	}
}

// do sends an HTTP request with a bearer token (none when empty).
func (f *fixture) do(t testing.TB, token, method, path string, body io.Reader) (*http.Response, string) {
	t.Helper()
	return f.doHeader(t, token, method, path, body, nil)
}

// doHeader is do with more request headers.
func (f *fixture) doHeader(t testing.TB, token, method, path string, body io.Reader, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// withToken attaches a bearer token to a gRPC call.
func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// echo is a function (a Go SDK function server) returning its input.
var echo = ziptrail.FunctionHandler(func(_ context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	return inv.Objects[0].Bytes(), nil
})

func contains(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
