package activatorext

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ziptrail/ziptrail/internal/control"
	"github.com/ziptrail/ziptrail/internal/controlplane"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

// apiSecrets reads key Secrets from a real kube-apiserver, as activator-ext
// does, counting the reads per namespace; a namespace in gates waits for its
// channel before each read (a slow API server).
type apiSecrets struct {
	kube  kubernetes.Interface
	mu    sync.Mutex
	reads map[string]int
	gates map[string]chan struct{}
	// started receives the namespace of each read as it begins.
	started chan string
}

func (a *apiSecrets) get(ctx context.Context, ns, name string) (*corev1.Secret, error) {
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
	return a.kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
}

func (a *apiSecrets) count(ns string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reads[ns]
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
// activator-ext with a real API server behind it: requests whose
// Ziptrail-Refs carry forged references under random key ids. The key
// Secret is read once, however many forged references arrive; a real
// reference in the same flood is still kept alive; and a slow Secret read
// in one namespace does not hold up keep-alives in another.
func TestForgedReferencesDoNotHammerTheAPIServer(t *testing.T) {
	env, err := controlplane.Start()
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
	api := &apiSecrets{kube: kube, reads: map[string]int{}, gates: map[string]chan struct{}{}, started: make(chan string, 1)}
	// No re-read within the test: every forged key id after the first read
	// is answered from it.
	dp := &DataPlaneExtender{Secrets: api.get, MinReread: time.Hour}
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
		t.Errorf("%d forged references under random key ids made %d Secret reads, want 1", forged, n)
	}
	if got := p.expires(t, "genuine"); !got.After(exp) {
		t.Errorf("the genuine reference was not kept alive: its object still expires at %v", got)
	}
	t.Logf("%d forged references: %d refused as gone, %d left to retry, %d Secret reads", forged, gone.Load(), retried.Load(), api.count(testNS))

	// A slow API server in one namespace: keep-alives elsewhere go on.
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
		t.Errorf("an extend in %s waited 30 s for team-slow's Secret read: one lock for every namespace", testNS)
	}
	close(gate)
	if err := <-slowDone; err == nil {
		t.Error("a forged reference in team-slow was extended")
	}
}
