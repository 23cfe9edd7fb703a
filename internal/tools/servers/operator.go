package servers

import (
	"context"
	"net"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
)

// Operator is the operator's control server (with its messaging
// directory) on a real kube-apiserver and etcd (envtest), authenticating
// sidecars with TokenReview as cmd/operator does. PodToken makes the
// pod-bound token a sidecar presents, as the kubelet projects it.
type Operator struct {
	Addr   string // the control stream's host:port
	Server *control.Server
	env    *envtest.Env
	k8s    client.Client
	kube   kubernetes.Interface
}

// noEvents: these tests run no trigger engine.
type noEvents struct{}

func (noEvents) ObjectReady(context.Context, control.Identity, *controlv1.ObjectReady) error {
	return nil
}
func (noEvents) FunctionStarted(context.Context, control.Identity, *controlv1.FunctionStarted) error {
	return nil
}
func (noEvents) FunctionFinished(context.Context, control.Identity, *controlv1.FunctionFinished) error {
	return nil
}

// StartOperator runs the API server and the control server until cleanup.
func StartOperator(t TB) *Operator {
	t.Helper()
	ctrllog.SetLogger(logr.Discard())
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	o := &Operator{env: env}
	if o.k8s, err = client.New(env.Config, client.Options{Scheme: envtest.Scheme()}); err != nil {
		t.Fatal(err)
	}
	if o.kube, err = kubernetes.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	o.Server = control.NewServer(noEvents{}, &control.SecretKeys{Client: o.k8s})
	o.Server.Auth = &control.TokenReviewer{Client: o.k8s}
	gs := grpc.NewServer(control.ServerOptions()...)
	controlv1.RegisterControlServer(gs, o.Server)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	o.Addr = ln.Addr().String()
	return o
}

// PodToken creates the namespace (if needed) and a pod in it, and writes
// the pod-bound token for the control stream's audience to a file, which
// a sidecar reads as its ZIPTRAIL_TOKEN_FILE.
func (o *Operator) PodToken(t TB, namespace, pod string) string {
	t.Helper()
	token, err := BoundPodToken(context.Background(), o.k8s, o.kube, namespace, pod)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), namespace+"-"+pod+".token")
	if err := os.WriteFile(path, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// BoundPodToken creates the namespace (if needed), the ServiceAccount "fn"
// (if needed) and pod namespace/pod running as it, and returns a token
// for the control stream's audience bound to that pod, as the kubelet
// projects it.
func BoundPodToken(ctx context.Context, k8s client.Client, kube kubernetes.Interface, namespace, pod string) (string, error) {
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); client.IgnoreAlreadyExists(err) != nil {
		return "", err
	}
	if err := k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "fn"}}); client.IgnoreAlreadyExists(err) != nil {
		return "", err
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: pod},
		Spec: corev1.PodSpec{ServiceAccountName: "fn", Containers: []corev1.Container{{Name: "user-container", Image: "example.com/fn"}}}}
	if err := k8s.Create(ctx, p); err != nil {
		return "", err
	}
	tr, err := kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "fn", &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{controlclient.Audience}, ExpirationSeconds: ptr.To(int64(3600)),
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}
