package control_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// recorder collects the events the server delivers.
type recorder struct {
	mu      sync.Mutex
	objects []*controlv1.ObjectReady
	from    []control.Identity
	got     chan struct{}
}

func (r *recorder) ObjectReady(_ context.Context, id control.Identity, ev *controlv1.ObjectReady) error {
	r.mu.Lock()
	r.objects = append(r.objects, ev)
	r.from = append(r.from, id)
	r.mu.Unlock()
	r.got <- struct{}{}
	return nil
}
func (r *recorder) FunctionStarted(context.Context, control.Identity, *controlv1.FunctionStarted) error {
	return nil
}
func (r *recorder) FunctionFinished(context.Context, control.Identity, *controlv1.FunctionFinished) error {
	return nil
}

func TestControlStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ae := newAuthEnv(t)
	k8s, keys, srv, cl, rec := ae.k8s, ae.keys, ae.srv, ae.cl, &ae.rec.recorder
	tokens := map[string]string{}
	for _, p := range []struct{ ns, name string }{{"team-a", "pod-a"}, {"team-b", "pod-b"}, {"team-a", "pod-c"}} {
		tokens[p.name] = ae.podToken(t, ae.pod(t, p.ns, p.name), control.Audience)
	}

	// Each sidecar presents its own pod's token.
	connect := func(ns, pod string) controlv1.Control_ConnectClient {
		t.Helper()
		st, err := cl.Connect(withToken(ctx, tokens[pod]))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Hello{Hello: &controlv1.Hello{
			Namespace: ns, Workflow: "wf", Function: "map", Pod: pod, DataplaneAddr: "10.0.0.1:9091"}}}); err != nil {
			t.Fatal(err)
		}
		return st
	}

	// The first answer is the namespace's keys, stored in a Secret.
	a := connect("team-a", "pod-a")
	m, err := a.Recv()
	if err != nil {
		t.Fatal(err)
	}
	k := m.GetKeys()
	if k == nil || len(k.Keys) != 1 || len(k.Keys[0].Secret) != 32 || k.ActiveKeyId != k.Keys[0].Id {
		t.Fatalf("want one 32-byte active key, got %v", m)
	}
	// Then what the operator understands beyond the first version.
	if f, err := a.Recv(); err != nil || !f.GetFeatures().GetEvents() {
		t.Fatalf("after the keys: %v %v, want Features with events", f, err)
	}
	sec := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: control.KeySecretName}, sec); err != nil {
		t.Fatalf("key secret: %v", err)
	}
	b := connect("team-b", "pod-b")
	mb, err := b.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if string(mb.GetKeys().Keys[0].Secret) == string(k.Keys[0].Secret) {
		t.Fatal("two namespaces share a reference key")
	}
	if f, err := b.Recv(); err != nil || f.GetFeatures() == nil {
		t.Fatalf("team-b after the keys: %v %v, want Features", f, err)
	}

	// Events reach the engine side with the sender's identity.
	if err := a.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{
		Session: "s1", Bucket: "b", Key: "k", Size: 3, Inline: []byte("abc")}}}); err != nil {
		t.Fatal(err)
	}
	<-rec.got
	rec.mu.Lock()
	if rec.from[0].Pod != "pod-a" || rec.from[0].DataplaneAddr != "10.0.0.1:9091" || string(rec.objects[0].Inline) != "abc" {
		t.Errorf("got %+v from %+v", rec.objects[0], rec.from[0])
	}
	rec.mu.Unlock()

	// GC commands reach only the sidecars of their namespace.
	if err := srv.Drop("team-b", "s9", nil); err != nil {
		t.Fatal(err)
	}
	mb, err = b.Recv()
	if err != nil || mb.GetDrop().GetSession() != "s9" {
		t.Fatalf("team-b sidecar: %v %v", mb, err)
	}
	if err := srv.Drop("team-a", "s1", []string{"b/k"}); err != nil {
		t.Fatal(err)
	}
	m, err = a.Recv()
	if err != nil || m.GetDrop().GetSession() != "s1" || m.GetDrop().Keys[0] != "b/k" {
		t.Fatalf("team-a sidecar got %v %v (a foreign namespace's command leaked?)", m, err)
	}
	if got := len(srv.Sidecars("team-a")); got != 1 {
		t.Errorf("Sidecars(team-a) = %d, want 1", got)
	}

	// Rotation keeps old keys and seals with the new one.
	rot, err := keys.Rotate(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(rot.Keys) != 2 || rot.ActiveKeyId == k.ActiveKeyId {
		t.Errorf("after rotation: %v", rot)
	}

	// Bad input ends a stream with a clear error.
	bad, err := cl.Connect(withToken(ctx, tokens["pod-a"]))
	if err != nil {
		t.Fatal(err)
	}
	_ = bad.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{}}})
	if _, err := bad.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("stream without Hello: %v, want InvalidArgument", err)
	}
	// Each stream below sends one bad message after its Hello; the server
	// ends it with InvalidArgument (what it sent before is read past).
	refused := func(what string, m *controlv1.SidecarMessage) {
		t.Helper()
		st := connect("team-a", "pod-c")
		_ = st.Send(m)
		for {
			if _, err := st.Recv(); err != nil {
				if status.Code(err) != codes.InvalidArgument {
					t.Errorf("%s: %v, want InvalidArgument", what, err)
				}
				return
			}
		}
	}
	object := func(seq uint64) *controlv1.SidecarMessage {
		return &controlv1.SidecarMessage{Seq: seq, Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{
			Session: "s", Bucket: "b", Key: "k", Inline: []byte("x")}}}
	}
	events := func(seq uint64, evs ...*controlv1.SidecarMessage) *controlv1.SidecarMessage {
		return &controlv1.SidecarMessage{Seq: seq, Msg: &controlv1.SidecarMessage_Events{Events: &controlv1.Events{Events: evs}}}
	}
	refused("object without ref or bytes", &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{Session: "s", Bucket: "b", Key: "k"}}})
	refused("Events with a seq of its own", events(7, object(1)))
	refused("Events without events", events(0))
	refused("Events holding an event without a seq", events(0, object(1), object(0)))
	refused("Events out of order", events(0, object(2), object(1)))
	refused("Events holding Events", events(0, events(1, object(2))))
	refused("Events holding a Hello", events(0, &controlv1.SidecarMessage{Seq: 1, Msg: &controlv1.SidecarMessage_Hello{Hello: &controlv1.Hello{Namespace: "team-a", Pod: "pod-c"}}}))
	refused("Events holding a bad event", events(0, object(1), &controlv1.SidecarMessage{Seq: 2, Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{}}}))
	many := make([]*controlv1.SidecarMessage, 257)
	for i := range many {
		many[i] = object(uint64(i + 1))
	}
	refused("Events with 257 events", events(0, many...))
}
