package control_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// TestAuthenticatedControlStream plays sidecars with real projected tokens
// (issued and reviewed by a real API server) against the operator's
// control server: each is scoped to its token's namespace and pod, and
// whatever is not a valid token for the control audience is refused with a
// status saying why.
func TestAuthenticatedControlStream(t *testing.T) {
	a := newAuthEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pa, qa, rb := a.pod(t, "team-a", "map-p"), a.pod(t, "team-a", "map-q"), a.pod(t, "team-b", "map-r")
	tokP, tokQ, tokR := a.podToken(t, pa, control.Audience), a.podToken(t, qa, control.Audience), a.podToken(t, rb, control.Audience)
	secretOf := func(ns string) string {
		k, err := a.keys.Keys(ctx, ns)
		if err != nil {
			t.Fatal(err)
		}
		return string(k.Keys[0].Secret)
	}

	t.Run("a pod gets its own namespace's keys and no other's", func(t *testing.T) {
		st, k, err := a.connect(ctx, tokP, "team-a", "map-p")
		if err != nil {
			t.Fatalf("valid token, own namespace and pod: %v", err)
		}
		defer st.CloseSend()
		if k == nil || string(k.Keys[0].Secret) != secretOf("team-a") {
			t.Fatalf("got %v, want team-a's keys", k)
		}
		if string(k.Keys[0].Secret) == secretOf("team-b") {
			t.Fatal("team-a's pod was handed team-b's key")
		}

		before := rejections(t, control.ReasonForeignNamespace)
		_, k, err = a.connect(ctx, tokP, "team-b", "map-p")
		wantStatus(t, "team-a's token, Hello for team-b", err, codes.PermissionDenied, `"team-b"`, "team-a/map-p")
		if k != nil {
			t.Errorf("team-a's token got keys for team-b: %v", k)
		}
		if got := rejections(t, control.ReasonForeignNamespace); got != before+1 {
			t.Errorf("foreign_namespace rejections %v -> %v, want +1", before, got)
		}

		before = rejections(t, control.ReasonForeignPod)
		_, _, err = a.connect(ctx, tokP, "team-a", "map-q")
		wantStatus(t, "map-p's token, Hello for map-q", err, codes.PermissionDenied, `"map-q"`, "team-a/map-p")
		if got := rejections(t, control.ReasonForeignPod); got != before+1 {
			t.Errorf("foreign_pod rejections %v -> %v, want +1", before, got)
		}

		// GetKeys: a pod reads its own namespace's keys, not another's.
		if k, err := a.cl.GetKeys(withToken(ctx, tokR), &controlv1.GetKeysRequest{Namespace: "team-b"}); err != nil || string(k.Keys[0].Secret) != secretOf("team-b") {
			t.Errorf("team-b's pod reading team-b's keys: %v %v", k, err)
		}
		before = rejections(t, control.ReasonKeysForbidden)
		k, err = a.cl.GetKeys(withToken(ctx, tokR), &controlv1.GetKeysRequest{Namespace: "team-a"})
		wantStatus(t, "team-b's pod reading team-a's keys", err, codes.PermissionDenied, `"team-a"`)
		if k != nil {
			t.Errorf("team-b's pod got team-a's keys: %v", k)
		}
		if got := rejections(t, control.ReasonKeysForbidden); got != before+1 {
			t.Errorf("keys_forbidden rejections %v -> %v, want +1", before, got)
		}
	})

	t.Run("invalid tokens are unauthenticated", func(t *testing.T) {
		parts := strings.Split(tokP, ".")
		sig := []byte(parts[2])
		if sig[10] == 'A' {
			sig[10] = 'B'
		} else {
			sig[10] = 'A'
		}
		otherPayload := strings.Split(tokR, ".")[1]
		expiredAt := time.Now().Add(-time.Hour).Unix()
		cases := []struct {
			name, token string
			words       []string
		}{
			{"no token", "", []string{"no bearer token", control.Audience}},
			{"random string", "not-a-token-" + rand.Text(), []string{"rejected the token"}},
			{"tampered signature", parts[0] + "." + parts[1] + "." + string(sig), []string{"rejected the token"}},
			{"payload of another pod's token under this signature", parts[0] + "." + otherPayload + "." + parts[2], []string{"rejected the token"}},
			{"expired", a.resign(t, tokP, func(c map[string]any) { c["exp"], c["iat"], c["nbf"] = expiredAt, expiredAt-3600, expiredAt-3600 }), []string{"rejected the token"}},
			{"wrong audience", a.podToken(t, pa, "other.example.com"), []string{"rejected the token", control.Audience}},
			{"the API server's audience", a.saToken(t, "team-a", "fn"), []string{"rejected the token"}},
		}
		for _, c := range cases {
			before := rejections(t, control.ReasonUnauthenticated) + rejections(t, control.ReasonNoToken)
			_, k, err := a.connect(ctx, c.token, "team-a", "map-p")
			wantStatus(t, c.name+": Connect", err, codes.Unauthenticated, c.words...)
			if k != nil {
				t.Errorf("%s: got keys %v", c.name, k)
			}
			_, err = a.cl.GetKeys(withToken(ctx, c.token), &controlv1.GetKeysRequest{Namespace: "team-a"})
			wantStatus(t, c.name+": GetKeys", err, codes.Unauthenticated, c.words...)
			if got := rejections(t, control.ReasonUnauthenticated) + rejections(t, control.ReasonNoToken); got != before+2 {
				t.Errorf("%s: rejections %v -> %v, want +2", c.name, before, got)
			}
		}
		// The re-signing above makes tokens the API server accepts: the
		// expired one was refused for its expiry, not its signature.
		same := a.resign(t, tokP, func(map[string]any) {})
		st, k, err := a.connect(ctx, same, "team-a", "map-p")
		if err != nil || k == nil {
			t.Fatalf("a token re-signed unchanged was refused (%v): the expired case proves nothing", err)
		}
		_ = st.CloseSend()
	})

	t.Run("tokens not bound to a pod, or of a deleted pod", func(t *testing.T) {
		before := rejections(t, control.ReasonNotPodBound)
		_, _, err := a.connect(ctx, a.saToken(t, "team-a", "fn", control.Audience), "team-a", "map-p")
		wantStatus(t, "unbound token", err, codes.PermissionDenied, "not bound to a pod")
		if got := rejections(t, control.ReasonNotPodBound); got != before+1 {
			t.Errorf("not_pod_bound rejections %v -> %v, want +1", before, got)
		}
		gone := a.pod(t, "team-a", "map-gone")
		tok := a.podToken(t, gone, control.Audience)
		if err := a.k8s.Delete(ctx, gone, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
		_, _, err = a.connect(ctx, tok, "team-a", "map-gone")
		wantStatus(t, "token of a deleted pod", err, codes.Unauthenticated, "rejected the token")
	})

	t.Run("events only for the pod's own invocations and its namespace's sessions", func(t *testing.T) {
		p, _, err := a.connect(ctx, tokP, "team-a", "map-p")
		if err != nil {
			t.Fatal(err)
		}
		q, _, err := a.connect(ctx, tokQ, "team-a", "map-q")
		if err != nil {
			t.Fatal(err)
		}
		defer q.CloseSend()
		send := func(st controlv1.Control_ConnectClient, seq uint64, m *controlv1.SidecarMessage) {
			t.Helper()
			m.Seq = seq
			if err := st.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		started := func(inv string) *controlv1.SidecarMessage {
			return &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionStarted{FunctionStarted: &controlv1.FunctionStarted{
				Session: "wf-a-1", Function: "map", InvocationId: inv}}}
		}
		object := func(session, inv, key string) *controlv1.SidecarMessage {
			return &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{
				Session: session, Bucket: "b", Key: key, Inline: []byte("x"), InvocationId: inv}}}
		}
		// recv reads answers until one satisfies ok.
		recv := func(st controlv1.Control_ConnectClient, what string, ok func(*controlv1.OperatorMessage) bool) *controlv1.OperatorMessage {
			t.Helper()
			for {
				m, err := st.Recv()
				if err != nil {
					t.Fatalf("waiting for %s: %v", what, err)
				}
				if ok(m) {
					return m
				}
			}
		}
		acked := func(seq uint64) func(*controlv1.OperatorMessage) bool {
			return func(m *controlv1.OperatorMessage) bool { return m.GetAck().GetSeq() >= seq }
		}
		a.rec.mu.Lock()
		nObjects := len(a.rec.objects)
		a.rec.mu.Unlock()

		// p runs invocation wf-a-1.1.
		send(p, 1, started("wf-a-1.1"))
		recv(p, "p's ack", acked(1))

		// q reports an object of p's invocation, and finishes it: refused,
		// told, counted, acknowledged; q's stream goes on.
		before := rejections(t, control.ReasonForeignInvocation)
		send(q, 1, object("wf-a-1", "wf-a-1.1", "forged"))
		m := recv(q, "the refusal", func(m *controlv1.OperatorMessage) bool { return m.GetRejected() != nil })
		if r := m.GetRejected(); r.Seq != 1 || codes.Code(r.Code) != codes.PermissionDenied || !strings.Contains(r.Message, "wf-a-1.1") {
			t.Errorf("refusal %v", r)
		}
		send(q, 2, &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionFinished{FunctionFinished: &controlv1.FunctionFinished{
			Session: "wf-a-1", Function: "map", InvocationId: "wf-a-1.1", Failed: true}}})
		recv(q, "q's ack of the refused events", acked(2))
		if got := rejections(t, control.ReasonForeignInvocation); got != before+2 {
			t.Errorf("foreign_invocation rejections %v -> %v, want +2", before, got)
		}

		// An object naming team-b's session, from team-a's pod.
		before = rejections(t, control.ReasonForeignSession)
		send(q, 3, object("wf-b-1", "", "foreign-session"))
		m = recv(q, "the refusal", func(m *controlv1.OperatorMessage) bool { return m.GetRejected() != nil })
		if r := m.GetRejected(); r.Seq != 3 || !strings.Contains(r.Message, "wf-b-1") || !strings.Contains(r.Message, "another namespace") {
			t.Errorf("refusal %v", r)
		}
		if got := rejections(t, control.ReasonForeignSession); got != before+1 {
			t.Errorf("foreign_session rejections %v -> %v, want +1", before, got)
		}

		// q's own invocation, and p's object of its own, go through.
		send(q, 4, started("wf-a-1.2"))
		send(q, 5, object("wf-a-1", "wf-a-1.2", "q-own"))
		recv(q, "q's ack", acked(5))
		send(p, 2, object("wf-a-1", "wf-a-1.1", "p-own"))
		recv(p, "p's ack", acked(2))

		// p goes away (its pod died): the dispatcher's retry of its
		// invocation lands on q, which may now report it.
		_ = p.CloseSend()
		for {
			if _, err := p.Recv(); err != nil {
				break
			}
		}
		waitFor(t, "p's stream to close on the server", func() bool {
			for _, id := range a.srv.Sidecars("team-a") {
				if id.Pod == "map-p" {
					return false
				}
			}
			return true
		})
		send(q, 6, object("wf-a-1", "wf-a-1.1", "retried"))
		recv(q, "q's ack", acked(6))

		a.rec.mu.Lock()
		var keys []string
		for _, o := range a.rec.objects[nObjects:] {
			keys = append(keys, o.Key)
		}
		started1 := fmt.Sprint(a.rec.started)
		a.rec.mu.Unlock()
		if strings.Join(keys, ",") != "q-own,p-own,retried" {
			t.Errorf("the engine got objects %v, want q-own, p-own, retried (forged and foreign-session refused)", keys)
		}
		if started1 != "[wf-a-1.1 wf-a-1.2]" {
			t.Errorf("the engine got starts %s", started1)
		}
	})

	t.Run("the node is the token's, the Hello's only when the token has none", func(t *testing.T) {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
		if err := a.k8s.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		a.serviceAccount(t, "team-a", "fn")
		placed := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "map-on-a"},
			Spec: corev1.PodSpec{ServiceAccountName: "fn", NodeName: "node-a", Containers: []corev1.Container{{Name: "user-container", Image: "example.com/fn"}}}}
		if err := a.k8s.Create(ctx, placed); err != nil {
			t.Fatal(err)
		}
		tokPlaced := a.podToken(t, placed, control.Audience)

		// What TokenReview says of each token.
		rv := &control.TokenReviewer{Client: a.k8s}
		cases := []struct {
			name, token, node, nodeUID string
		}{
			{"a pod on node-a", tokPlaced, "node-a", string(node.UID)},
			{"a pod not scheduled", tokP, "", ""},
			{"a token bound to no pod", a.saToken(t, "team-a", "fn", control.Audience), "", ""},
		}
		for _, c := range cases {
			caller, err := rv.Authenticate(ctx, c.token)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if caller.Node != c.node || caller.NodeUID != c.nodeUID {
				t.Errorf("%s: caller node %q (uid %q), want %q (uid %q)", c.name, caller.Node, caller.NodeUID, c.node, c.nodeUID)
			}
		}

		// The stream's identity: the token's node whatever the Hello
		// claims; the Hello's when the token carries none.
		hello := func(token, pod, node string) controlv1.Control_ConnectClient {
			t.Helper()
			st, err := a.cl.Connect(withToken(ctx, token))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Hello{Hello: &controlv1.Hello{
				Namespace: "team-a", Workflow: "wf", Function: "map", Pod: pod, Node: node, DataplaneAddr: "10.0.0.1:9192"}}}); err != nil {
				t.Fatal(err)
			}
			for {
				m, err := st.Recv()
				if err != nil {
					t.Fatalf("%s's stream: %v", pod, err)
				}
				if m.GetKeys() != nil {
					return st
				}
			}
		}
		nodeOf := func(pod string) (string, bool) {
			for _, id := range a.srv.Sidecars("team-a") {
				if id.Pod == pod {
					return id.Node, true
				}
			}
			return "", false
		}
		st := hello(tokPlaced, "map-on-a", "node-forged")
		defer st.CloseSend()
		waitFor(t, "map-on-a's stream", func() bool { _, ok := nodeOf("map-on-a"); return ok })
		if got, _ := nodeOf("map-on-a"); got != "node-a" {
			t.Errorf("a pod on node-a saying node-forged in its Hello: identity node %q, want the token's node-a", got)
		}
		st2 := hello(a.podToken(t, a.pod(t, "team-a", "map-hint"), control.Audience), "map-hint", "node-hint")
		defer st2.CloseSend()
		waitFor(t, "map-hint's stream", func() bool { _, ok := nodeOf("map-hint"); return ok })
		if got, _ := nodeOf("map-hint"); got != "node-hint" {
			t.Errorf("a token without a node, Hello saying node-hint: identity node %q, want the hint", got)
		}
	})

	t.Run("activator-ext reads keys when allow-listed", func(t *testing.T) {
		act := a.saToken(t, "knative-serving", "activator", control.Audience)
		for _, ns := range []string{"team-a", "team-b"} {
			k, err := a.cl.GetKeys(withToken(ctx, act), &controlv1.GetKeysRequest{Namespace: ns})
			if err != nil || string(k.Keys[0].Secret) != secretOf(ns) {
				t.Errorf("the activator reading %s's keys: %v %v", ns, k, err)
			}
		}
		other := a.saToken(t, "knative-serving", "controller", control.Audience)
		_, err := a.cl.GetKeys(withToken(ctx, other), &controlv1.GetKeysRequest{Namespace: "team-a"})
		wantStatus(t, "another knative-serving ServiceAccount reading keys", err, codes.PermissionDenied, "system:serviceaccount:knative-serving:controller", "--control-key-readers")
		_, err = a.cl.GetKeys(withToken(ctx, a.saToken(t, "knative-serving", "activator", "other.example.com")), &controlv1.GetKeysRequest{Namespace: "team-a"})
		wantStatus(t, "the activator's token for another audience", err, codes.Unauthenticated)
		// The activator's token opens no stream: it is no pod's.
		_, _, err = a.connect(ctx, act, "knative-serving", "activator")
		wantStatus(t, "the activator's token on a stream", err, codes.PermissionDenied, "not bound to a pod")
	})

	t.Run("reviews are cached", func(t *testing.T) {
		tok := a.podToken(t, pa, control.Audience)
		n := a.reviews.n.Load()
		for range 10 {
			if _, err := a.cl.GetKeys(withToken(ctx, tok), &controlv1.GetKeysRequest{Namespace: "team-a"}); err != nil {
				t.Fatal(err)
			}
		}
		if got := a.reviews.n.Load() - n; got != 1 {
			t.Errorf("10 calls with one token made %d TokenReviews, want 1", got)
		}
	})

	t.Run("a stream ends when its token expires", func(t *testing.T) {
		tok := a.podToken(t, pa, control.Audience)
		var claims struct{ Exp int64 }
		payload, _ := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[1])
		if err := json.Unmarshal(payload, &claims); err != nil {
			t.Fatal(err)
		}
		// The server's clock runs 2 s short of the token's expiry.
		shift := time.Until(time.Unix(claims.Exp, 0)) - 2*time.Second
		a.srv.Now = func() time.Time { return time.Now().Add(shift) }
		defer func() { a.srv.Now = nil }()
		st, _, err := a.connect(ctx, tok, "team-a", "map-p")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			for {
				if _, err := st.Recv(); err != nil {
					done <- err
					return
				}
			}
		}()
		select {
		case err := <-done:
			wantStatus(t, "stream past its token's expiry", err, codes.Unauthenticated, "expired", "reconnect")
		case <-time.After(time.Minute):
			t.Error("the stream outlived its token")
		}
	})
}

// TestControlClientPresentsItsPodToken: the sidecar's client reads its
// pod's projected token from the file Knative mounts and gets its keys;
// with a token of another namespace's pod it gets none.
func TestControlClientPresentsItsPodToken(t *testing.T) {
	a := newAuthEnv(t)
	dir := t.TempDir()
	pa, rb := a.pod(t, "team-a", "map-p"), a.pod(t, "team-b", "map-r")
	fileA, fileB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(fileA, []byte(a.podToken(t, pa, control.Audience)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fileB, []byte(a.podToken(t, rb, control.Audience)), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(file string) (chan *controlv1.Keys, *controlclient.Client, *sync.Mutex, *[]error) {
		keys := make(chan *controlv1.Keys, 4)
		var mu sync.Mutex
		var errs []error
		cl := controlclient.NewClient(a.addr, controlclient.FileToken(file), &controlv1.Hello{Namespace: "team-a", Pod: "map-p", Function: "map"},
			controlclient.Commands{Keys: func(k *controlv1.Keys) { keys <- k }})
		cl.Log = func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go func() { _ = cl.Run(ctx) }()
		return keys, cl, &mu, &errs
	}
	keys, _, _, _ := run(fileA)
	select {
	case k := <-keys:
		want, err := a.keys.Keys(context.Background(), "team-a")
		if err != nil {
			t.Fatal(err)
		}
		if string(k.Keys[0].Secret) != string(want.Keys[0].Secret) {
			t.Error("the client got keys other than its namespace's")
		}
	case <-time.After(time.Minute):
		t.Fatal("the client with its pod's token got no keys")
	}

	// A token of team-b's pod claiming team-a's pod: refused, no keys.
	keysB, _, mu, errs := run(fileB)
	waitFor(t, "the refusal", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(*errs) > 0
	})
	mu.Lock()
	err := (*errs)[0]
	mu.Unlock()
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("team-b's token connecting as team-a's pod: %v, want PermissionDenied", err)
	}
	select {
	case k := <-keysB:
		t.Errorf("team-b's token got keys %v", k)
	default:
	}

	// A missing token file: the client says where the token is expected.
	_, _, mu, errs = run(filepath.Join(dir, "missing"))
	waitFor(t, "the error", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(*errs) > 0
	})
	mu.Lock()
	if msg := (*errs)[0].Error(); !strings.Contains(msg, "queue-sidecar-token-audiences") || !strings.Contains(msg, control.Audience) {
		t.Errorf("missing token file: %q does not say how Knative mounts the token", msg)
	}
	mu.Unlock()
}
