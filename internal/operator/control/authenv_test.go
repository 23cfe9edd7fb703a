package control_test

// This file is the fixture of auth_test.go: a real API server that issues
// and reviews tokens, and the operator's control server on it.

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard/guardtest"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
)

// authEnv is a real API server that issues and reviews service-account
// tokens, and the operator's control server on it, authenticating with
// TokenReview as cmd/operator does.
type authEnv struct {
	env     *envtest.Env
	k8s     client.Client
	kube    kubernetes.Interface
	keys    *control.SecretKeys
	srv     *control.Server
	rec     *scopedRecorder
	reviews *countingClient
	cl      controlv1.ControlClient
	addr    string
	read    *guardtest.CountingListener // bytes the server read from its connections
}

// countingClient counts the TokenReviews the server asks for.
type countingClient struct {
	client.Client
	n atomic.Int64
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*authnv1.TokenReview); ok {
		c.n.Add(1)
	}
	return c.Client.Create(ctx, obj, opts...)
}

// scopedRecorder is a recorder that also knows sessions' namespaces, as
// the orchestrator does (control.SessionScope).
type scopedRecorder struct {
	recorder
	sessions map[string]string
	started  []string // invocations of FunctionStarted
}

func (r *scopedRecorder) SessionNamespace(id string) (string, bool) {
	ns, ok := r.sessions[id]
	return ns, ok
}

func (r *scopedRecorder) FunctionStarted(_ context.Context, _ control.Identity, ev *controlv1.FunctionStarted) error {
	r.mu.Lock()
	r.started = append(r.started, ev.InvocationId)
	r.mu.Unlock()
	r.got <- struct{}{}
	return nil
}

func newAuthEnv(t *testing.T) *authEnv { return newAuthEnvWith(t, nil) }

// newAuthEnvWith is newAuthEnv whose server configure completes before it
// serves (e.g. its Limits).
func newAuthEnvWith(t *testing.T, configure func(*authEnv)) *authEnv {
	t.Helper()
	ctrllog.SetLogger(logr.Discard()) // controller-runtime's client logs nothing worth reading here
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	a := &authEnv{env: env}
	if a.k8s, err = client.New(env.Config, client.Options{Scheme: envtest.Scheme()}); err != nil {
		t.Fatal(err)
	}
	if a.kube, err = kubernetes.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{"team-a", "team-b", "knative-serving"} {
		if err := a.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	a.keys = &control.SecretKeys{Client: a.k8s}
	a.rec = &scopedRecorder{recorder: recorder{got: make(chan struct{}, 64)},
		sessions: map[string]string{"wf-a-1": "team-a", "wf-b-1": "team-b"}}
	a.srv = control.NewServer(a.rec, a.keys)
	a.reviews = &countingClient{Client: a.k8s}
	a.srv.Auth = &control.TokenReviewer{Client: a.reviews}
	a.srv.KeyReaders = []string{"system:serviceaccount:knative-serving:activator"}
	if configure != nil {
		configure(a)
	}
	// Served as cmd/operator serves it.
	gs := grpc.NewServer(a.srv.ServerOptions()...)
	controlv1.RegisterControlServer(gs, a.srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.read = &guardtest.CountingListener{Listener: ln}
	go func() { _ = gs.Serve(a.srv.Listener(a.read)) }()
	t.Cleanup(gs.Stop)
	a.addr = ln.Addr().String()
	cc, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	a.cl = controlv1.NewControlClient(cc)
	return a
}

// serviceAccount creates ns/name unless it exists.
func (a *authEnv) serviceAccount(t *testing.T, ns, name string) {
	t.Helper()
	err := a.k8s.Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	if client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
}

// pod creates a pod running as ServiceAccount "fn" and returns it.
func (a *authEnv) pod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	a.serviceAccount(t, ns, "fn")
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{ServiceAccountName: "fn", Containers: []corev1.Container{{Name: "user-container", Image: "example.com/fn"}}}}
	if err := a.k8s.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

// podToken is the token the kubelet projects into a pod for the audience:
// bound to the pod.
func (a *authEnv) podToken(t *testing.T, p *corev1.Pod, audience string) string {
	t.Helper()
	tr, err := a.kube.CoreV1().ServiceAccounts(p.Namespace).CreateToken(context.Background(), p.Spec.ServiceAccountName, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To(int64(3600)),
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// saToken is a token of ServiceAccount ns/name not bound to any object.
func (a *authEnv) saToken(t *testing.T, ns, name string, audiences ...string) string {
	t.Helper()
	a.serviceAccount(t, ns, name)
	tr, err := a.kube.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

func withToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// connect opens a stream with token and sends a Hello for ns/pod; it
// returns the stream and the first answer (keys) or the stream's error.
func (a *authEnv) connect(ctx context.Context, token, ns, pod string) (controlv1.Control_ConnectClient, *controlv1.Keys, error) {
	st, err := a.cl.Connect(withToken(ctx, token))
	if err != nil {
		return nil, nil, err
	}
	// A Send error (io.EOF: the server ended the stream before reading
	// the Hello, e.g. refusing the token) carries no status; Recv has it.
	_ = st.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Hello{Hello: &controlv1.Hello{
		Namespace: ns, Workflow: "wf", Function: "map", Pod: pod, DataplaneAddr: "10.0.0.1:9192"}}})
	m, err := st.Recv()
	if err != nil {
		return nil, nil, err
	}
	return st, m.GetKeys(), nil
}

// rejections reads ziptrail_control_rejections_total{reason} from the
// operator's metrics registry.
func rejections(t *testing.T, reason string) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ziptrail_control_rejections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func wantStatus(t *testing.T, what string, err error, code codes.Code, words ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: %v, want %s", what, err, code)
		return
	}
	for _, w := range words {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Errorf("%s: %q does not say %q", what, status.Convert(err).Message(), w)
		}
	}
}

// resign returns token with its claims changed by edit, signed again with
// the API server's service-account signing key: a token only the API
// server could have made, except for what edit changed.
func (a *authEnv) resign(t *testing.T, token string, edit func(claims map[string]any)) string {
	t.Helper()
	parts := strings.Split(token, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]any{}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	edit(claims)
	if payload, err = json.Marshal(claims); err != nil {
		t.Fatal(err)
	}
	pemKey, err := os.ReadFile(filepath.Join(a.env.ControlPlane.APIServer.CertDir, "sa-signer.key"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemKey)
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		t.Fatalf("the API server's signing key is a %T, this test signs with ECDSA", k)
	}
	signed := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	sum := sha256.Sum256([]byte(signed))
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}
