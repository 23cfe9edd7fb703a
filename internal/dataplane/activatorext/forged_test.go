package activatorext

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
)

// apiKeys reads keys as activator-ext does: from the operator's control
// service (GetKeys), authenticated with a token of the activator's
// ServiceAccount, the operator reading the Secrets of a real API server.
// It counts the reads per namespace; a namespace in gates waits for its
// channel before each read (a slow operator or API server).
type apiKeys struct {
	keys  KeyGetter
	mu    sync.Mutex
	reads map[string]int
	gates map[string]chan struct{}
	// started receives the namespace of each read as it begins.
	started chan string
}

func (a *apiKeys) get(ctx context.Context, ns string) (map[string][]byte, string, error) {
	a.mu.Lock()
	a.reads[ns]++
	gate := a.gates[ns]
	a.mu.Unlock()
	select {
	case a.started <- ns:
	default:
	}
	if gate != nil {
		<-gate
	}
	return a.keys(ctx, ns)
}

func (a *apiKeys) count(ns string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reads[ns]
}

// activatorAccount is the ServiceAccount the operator allow-lists for
// GetKeys in these tests, as the chart does for Knative's activator.
const activatorAccount = "system:serviceaccount:knative-serving:activator"

// operatorKeys runs the operator's control service on env (TokenReview,
// the allow-list, the key Secrets) and returns a KeyGetter for a token of
// ServiceAccount knative-serving/sa.
func operatorKeys(t *testing.T, env *envtest.Env, kube kubernetes.Interface, sa string) KeyGetter {
	t.Helper()
	ctrllog.SetLogger(logr.Discard()) // controller-runtime's client logs nothing worth reading here
	ctx := context.Background()
	k8s, err := client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Namespaces().Get(ctx, "knative-serving", metav1.GetOptions{}); err != nil {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "knative-serving"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kube.CoreV1().ServiceAccounts("knative-serving").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := kube.CoreV1().ServiceAccounts("knative-serving").CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{controlclient.Audience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := control.NewServer(nopEvents{}, &control.SecretKeys{Client: k8s})
	srv.Auth = &control.TokenReviewer{Client: k8s}
	srv.KeyReaders = []string{activatorAccount}
	gs := grpc.NewServer()
	controlv1.RegisterControlServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	token := tr.Status.Token
	kc, err := controlclient.NewKeysClient(ln.Addr().String(), func() (string, error) { return token, nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kc.Close() })
	return OperatorKeys(kc)
}

type nopEvents struct{}

func (nopEvents) ObjectReady(context.Context, control.Identity, *controlv1.ObjectReady) error {
	return nil
}
func (nopEvents) FunctionStarted(context.Context, control.Identity, *controlv1.FunctionStarted) error {
	return nil
}
func (nopEvents) FunctionFinished(context.Context, control.Identity, *controlv1.FunctionFinished) error {
	return nil
}

// forgedRef is what an attacker can make without a key: a well-formed
// reference under a random key id.
func forgedRef() string {
	id := make([]byte, 1+int(randByte())%32)
	_, _ = rand.Read(id)
	body := make([]byte, 12+40)
	_, _ = rand.Read(body)
	raw := append([]byte{byte(len(id))}, id...)
	return ref.Prefix + base64.RawURLEncoding.EncodeToString(append(raw, body...))
}

func randByte() byte {
	var b [1]byte
	_, _ = rand.Read(b[:])
	return b[0]
}

type roundKey struct{}

// TestForgedReferencesDoNotHammerTheAPIServer plays the attacker against
// activator-ext with the operator and a real API server behind it:
// requests whose Ziptrail-Refs carry forged references under random key
// ids. The keys are read once, however many forged references arrive; a
// real reference in the same flood is still kept alive; and a slow key
// read in one namespace does not hold up keep-alives in another.
func TestForgedReferencesDoNotHammerTheAPIServer(t *testing.T) {
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := startProducer(t)
	for _, ns := range []string{testNS, "team-slow"} {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		data := map[string][]byte{"active": []byte("k1")}
		for id, k := range p.keys {
			data[id] = k
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: control.KeySecretName}, Data: data}
		if _, err := kube.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	api := &apiKeys{keys: operatorKeys(t, env, kube, "activator"), reads: map[string]int{}, gates: map[string]chan struct{}{}, started: make(chan string, 1)}
	// No re-read within the test: every forged key id after the first read
	// is answered from it.
	dp := &DataPlaneExtender{Keys: api.get, MinReread: time.Hour}
	defer dp.Close()

	// Each request's first keep-alive round reports to the request, which
	// waits for it: the round runs to its end, as during a cold start.
	extend := func(ctx context.Context, ns, r string, until time.Time) error {
		err := dp.Extend(ctx, ns, r, until)
		if ch, ok := ctx.Value(roundKey{}).(chan error); ok {
			ch <- err
		}
		return err
	}
	var gone, retried atomic.Int64
	h := &Handler{
		KeepAlive: &Periodic{Extend: extend, Interval: time.Hour, Extension: 5 * time.Minute},
		Namespace: func(*http.Request) string { return testNS },
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ch := r.Context().Value(roundKey{}).(chan error)
			for range RequestFrom(r.Context()).Refs {
				if err := <-ch; errors.Is(err, ErrGone) {
					gone.Add(1)
				} else if err != nil {
					retried.Add(1)
				}
			}
		}),
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ch := make(chan error, MaxRefs)
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), roundKey{}, ch)))
	}))
	defer srv.Close()

	// One genuine reference among the forged ones: its object expires soon.
	exp := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	genuine := p.put(t, "genuine", exp)
	const requests = 20
	var wg sync.WaitGroup
	for i := range requests {
		refs := make([]string, MaxRefs)
		for j := range refs {
			refs[j] = forgedRef()
		}
		if i == 0 {
			refs[MaxRefs/2] = genuine
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
			req.Header.Set(HeaderRefs, strings.Join(refs, ","))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		}()
	}
	wg.Wait()
	forged := int64(requests*MaxRefs - 1)
	if got := gone.Load() + retried.Load(); got != forged {
		t.Errorf("%d forged references failed to extend, want all %d", got, forged)
	}
	if n := api.count(testNS); n != 1 {
		t.Errorf("%d forged references under random key ids made %d key reads, want 1", forged, n)
	}
	if got := p.expires(t, "genuine"); !got.After(exp) {
		t.Errorf("the genuine reference was not kept alive: its object still expires at %v", got)
	}
	t.Logf("%d forged references: %d refused as gone, %d left to retry, %d key reads", forged, gone.Load(), retried.Load(), api.count(testNS))

	// A slow key read in one namespace: keep-alives elsewhere go on.
	for len(api.started) > 0 {
		<-api.started
	}
	gate := make(chan struct{})
	api.mu.Lock()
	api.gates["team-slow"] = gate
	api.mu.Unlock()
	slowDone := make(chan error, 1)
	go func() {
		slowDone <- dp.Extend(ctx, "team-slow", forgedRef(), time.Now().Add(time.Minute))
	}()
	for ns := <-api.started; ns != "team-slow"; ns = <-api.started {
	}
	other := make(chan error, 1)
	go func() { other <- dp.Extend(ctx, testNS, genuine, time.Now().Add(time.Minute)) }()
	select {
	case err := <-other:
		if err != nil {
			t.Errorf("extend in %s while team-slow's Secret read hangs: %v", testNS, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("an extend in %s waited 30 s for team-slow's key read: one lock for every namespace", testNS)
	}
	close(gate)
	if err := <-slowDone; err == nil {
		t.Error("a forged reference in team-slow was extended")
	}
}

// TestKeysOnlyForTheAllowListedActivator: the operator hands reference
// keys to the activator's ServiceAccount, which it allow-lists, and not to
// another ServiceAccount of knative-serving: with that one's token nothing
// is kept alive, and the failure is one to retry (a configuration to fix),
// not a reference declared gone.
func TestKeysOnlyForTheAllowListedActivator(t *testing.T) {
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := startProducer(t)
	data := map[string][]byte{"active": []byte("k1")}
	for id, k := range p.keys {
		data[id] = k
	}
	if _, err := kube.CoreV1().Secrets(testNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: control.KeySecretName}, Data: data}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	r := p.put(t, "obj", exp)

	intruder := &DataPlaneExtender{Keys: operatorKeys(t, env, kube, "controller")}
	defer intruder.Close()
	err = intruder.Extend(ctx, testNS, r, time.Now().Add(5*time.Minute))
	if err == nil || errors.Is(err, ErrGone) || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Errorf("extend with knative-serving/controller's token: %v, want a retryable PermissionDenied", err)
	}
	if got := p.expires(t, "obj"); !got.Equal(exp) {
		t.Errorf("the object was extended to %v without the allow-listed token", got)
	}

	activator := &DataPlaneExtender{Keys: operatorKeys(t, env, kube, "activator")}
	defer activator.Close()
	if err := activator.Extend(ctx, testNS, r, time.Now().Add(5*time.Minute)); err != nil {
		t.Fatalf("extend with the activator's token: %v", err)
	}
	if got := p.expires(t, "obj"); !got.After(exp) {
		t.Errorf("the activator's extend left the object expiring at %v", got)
	}
}
