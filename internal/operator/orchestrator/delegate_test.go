package orchestrator

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// delegEnv is a real API server issuing and reviewing pod tokens, the
// operator's control server authenticating with TokenReview, and an
// orchestrator with delegation on behind it.
type delegEnv struct {
	t    *testing.T
	k8s  client.Client
	kube kubernetes.Interface
	cl   controlv1.ControlClient
	o    *Orchestrator
}

func newDelegEnv(t *testing.T, fns *servers.Functions, wfs ...string) *delegEnv {
	t.Helper()
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	d := &delegEnv{t: t}
	if d.k8s, err = client.New(env.Config, client.Options{Scheme: envtest.Scheme()}); err != nil {
		t.Fatal(err)
	}
	if d.kube, err = kubernetes.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"ns", "evil"} {
		if err := d.k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	if d.o, err = New(Options{Resolver: fns, Log: logr.Discard(), Delegate: true}); err != nil {
		t.Fatal(err)
	}
	srv := control.NewServer(d.o, &control.SecretKeys{Client: d.k8s})
	srv.Auth = &control.TokenReviewer{Client: d.k8s}
	d.o.SetControl(srv)
	for _, name := range wfs {
		wf := testWorkflow(name, "entry", "entry", "work")
		wf.Spec.Triggers = append(wf.Spec.Triggers, immediate("t", "a", "work"))
		if err := d.o.SetWorkflow(wf, true, ""); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.o.Run(ctx) }()
	gs := grpc.NewServer()
	controlv1.RegisterControlServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		gs.Stop()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	d.cl = controlv1.NewControlClient(cc)
	return d
}

// sidecar is one pod's control stream, opened with its real projected
// token, and what it was sent after its Keys.
type fakeSidecar struct {
	t   *testing.T
	st  controlv1.Control_ConnectClient
	seq uint64
}

func (d *delegEnv) sidecar(ctx context.Context, ns, pod, workflow string) *fakeSidecar {
	t := d.t
	t.Helper()
	token, err := servers.BoundPodToken(ctx, d.k8s, d.kube, ns, pod)
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.cl.Connect(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Hello{Hello: &controlv1.Hello{
		Namespace: ns, Workflow: workflow, Function: "entry", Pod: pod, DataplaneAddr: "10.0.0.1:9192"}}}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil || m.GetKeys() == nil {
		t.Fatalf("%s/%s: first message %v, %v; want its keys", ns, pod, m, err)
	}
	if m, err = st.Recv(); err != nil || m.GetFeatures() == nil {
		t.Fatalf("%s/%s: second message %v, %v; want the operator's features", ns, pod, m, err)
	}
	return &fakeSidecar{t: t, st: st}
}

// report sends an ObjectReady and returns what the operator answered
// before acknowledging it: Rejected, or nothing (applied).
func (s *fakeSidecar) report(ev *controlv1.ObjectReady) (rejected *controlv1.Rejected, before []*controlv1.OperatorMessage) {
	s.t.Helper()
	s.seq++
	if err := s.st.Send(&controlv1.SidecarMessage{Seq: s.seq, Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: ev}}); err != nil {
		s.t.Fatal(err)
	}
	for {
		m, err := s.st.Recv()
		if err != nil {
			s.t.Fatal(err)
		}
		switch {
		case m.GetAck() != nil && m.GetAck().Seq >= s.seq:
			return rejected, before
		case m.GetRejected() != nil:
			rejected = m.GetRejected()
		case m.GetAck() == nil:
			before = append(before, m)
		}
	}
}

// TestDelegationTrust plays sidecars with real pod tokens against the
// real control server: only the workflow's own pods get its delegated
// triggers, and a local firing counts only when the workflow's own pod
// reports it, for an object of an invocation it owns, under the derived
// id. Every other claim — another namespace's pod, another workflow's,
// another pod's invocation, a forged id, an unknown producing invocation
// — is refused or ignored, and the engine sends the invocation itself.
func TestDelegationTrust(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int{} // invocation ids work was sent
	entries := make(chan string, 4)
	fns := &servers.Functions{}
	fns.Add(t, "del-entry", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, err := invocation.Decode(r.Body)
		if err == nil {
			entries <- env.Invocation
		}
		// It sends its outputs through its sidecar (the test's reports).
		w.Header().Set(invocation.HeaderOutputsSent, "6")
	}))
	work := func(w http.ResponseWriter, r *http.Request) {
		if env, err := invocation.Decode(r.Body); err == nil {
			mu.Lock()
			got[env.Invocation]++
			mu.Unlock()
		}
	}
	fns.Add(t, "del-work", http.HandlerFunc(work))
	fns.Add(t, "other-work", http.HandlerFunc(work))
	d := newDelegEnv(t, fns, "del", "other")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	prod := d.sidecar(ctx, "ns", "del-entry-1", "del")
	// Its workflow's delegated triggers come right after its keys and
	// the operator's features.
	m, err := prod.st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := fns.URL(ctx, "ns", "del-work")
	if dl := m.GetDelegations(); len(dl.GetTriggers()) != 1 || dl.Triggers[0].Trigger != "t" || dl.Triggers[0].Bucket != "a" ||
		dl.Triggers[0].Function != "work" || dl.Triggers[0].Service != "del-work" || dl.Triggers[0].Url != want.String() {
		t.Fatalf("the workflow's pod got %v, want trigger t on a -> work at %s", m, want)
	}
	thief := d.sidecar(ctx, "ns", "del-entry-2", "del")
	if _, err := thief.st.Recv(); err != nil { // its delegations
		t.Fatal(err)
	}
	other := d.sidecar(ctx, "ns", "other-1", "nope") // a workflow that does not exist
	evil := d.sidecar(ctx, "evil", "evil-1", "del")  // another namespace naming the workflow
	for _, s := range []*fakeSidecar{other, evil} {
		if _, before := s.report(&controlv1.ObjectReady{Session: "none", Bucket: "a", Key: "x", Inline: []byte{}}); len(before) != 0 {
			t.Fatalf("a pod of another workflow or namespace was sent %v", before)
		}
	}

	id, err := d.o.StartSession(ctx, "ns", "del", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	var entry string
	select {
	case entry = <-entries:
	case <-ctx.Done():
		t.Fatal("entry was not invoked")
	}
	did := func(key string) string { return engine.DelegatedInvocation(id, "t", "work", "a", key) }
	obj := func(key, inv string, fired ...string) *controlv1.ObjectReady {
		return &controlv1.ObjectReady{Session: id, Bucket: "a", Key: key, Inline: []byte(key), ProducerFunction: "entry", InvocationId: inv, FiredLocally: fired}
	}
	before := testutil.ToFloat64(delegatedFirings)

	// The producer's own claim, under the derived id: recorded, not sent.
	if rej, _ := prod.report(obj("own", entry, did("own"))); rej != nil {
		t.Fatalf("the producer's own report was refused: %v", rej)
	}
	// Forged ids: another key's, another target's, made up.
	if rej, _ := prod.report(obj("forged", entry, did("own"), engine.DelegatedInvocation(id, "t", "evil", "a", "forged"), id+".d0")); rej != nil {
		t.Fatal(rej)
	}
	// Another pod of the workflow claiming the producer's invocation.
	if rej, _ := thief.report(obj("stolen", entry, did("stolen"))); rej == nil {
		t.Fatal("a report naming another pod's invocation was accepted")
	}
	// Another pod of the workflow, for an object no invocation produced.
	if rej, _ := thief.report(obj("unknown", "", did("unknown"))); rej != nil {
		t.Fatal(rej)
	}
	// Another namespace's pod naming the session.
	if rej, _ := evil.report(obj("evil", "", did("evil"))); rej == nil {
		t.Fatal("another namespace's claim for this session was accepted")
	}
	// Another workflow's pod of the namespace (workflow "other" exists).
	other2 := d.sidecar(ctx, "ns", "other-2", "other")
	if _, err := other2.st.Recv(); err != nil { // other's delegations
		t.Fatal(err)
	}
	if rej, _ := other2.report(obj("foreign", "", did("foreign"))); rej != nil {
		t.Fatal(rej)
	}

	if n := testutil.ToFloat64(delegatedFirings) - before; n != 1 {
		t.Errorf("%v firings recorded as delegated, want 1 (the producer's own)", n)
	}
	sent := []string{did("forged"), did("unknown"), did("foreign")}
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		ok := got[sent[0]] == 1 && got[sent[1]] == 1 && got[sent[2]] == 1
		mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("work was sent %v, want %v once each", got, sent)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if got[did("own")] != 0 {
		t.Errorf("the firing the producer made itself was sent again (%d)", got[did("own")])
	}
	for _, k := range []string{"stolen", "evil"} {
		if got[did(k)] != 0 {
			t.Errorf("a refused report fired %s", k)
		}
	}
}
