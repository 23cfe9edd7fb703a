package control_test

// SecretKeys against a real API server (kube-apiserver and etcd): its cache
// expires, notices a Secret deleted and created again, serves another
// replica's rotation within its TTL, and reads each namespace's Secret once
// at a time without holding up other namespaces.

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// keysAPI starts an API server with the namespaces and returns a client.
func keysAPI(t *testing.T, namespaces ...string) client.Client {
	t.Helper()
	ctrllog.SetLogger(logr.Discard())
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	k8s, err := client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range namespaces {
		if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	return k8s
}

func activeSecret(k *controlv1.Keys) []byte {
	for _, key := range k.Keys {
		if key.Id == k.ActiveKeyId {
			return key.Secret
		}
	}
	return nil
}

func sameKeys(a, b *controlv1.Keys) bool {
	return a.ActiveKeyId == b.ActiveKeyId && bytes.Equal(activeSecret(a), activeSecret(b)) && len(a.Keys) == len(b.Keys)
}

func TestSecretKeysExpire(t *testing.T) {
	k8s := keysAPI(t, "team-a")
	ctx := context.Background()
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	// Two operator replicas (sharded engine, or a leader and its successor).
	a := &control.SecretKeys{Client: k8s, Now: clock.Now}
	b := &control.SecretKeys{Client: k8s, Now: clock.Now}

	first, err := a.Keys(ctx, "team-a") // creates the Secret
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Keys(ctx, "team-a"); err != nil || !sameKeys(got, first) {
		t.Fatalf("the other replica read %v, %v; want the Secret replica a created (%s)", got, err, first.ActiveKeyId)
	}

	// An unchanged Secret read again after the TTL gives the same keys,
	// the same value (keyrings built from it are kept).
	clock.Add(control.DefaultKeysTTL + time.Second)
	if got, err := a.Keys(ctx, "team-a"); err != nil || got != first {
		t.Fatalf("after the TTL, an unchanged Secret gave %p (%v), want the cached %p", got, err, first)
	}

	// The Secret is deleted and made again (the namespace re-created under
	// the same name, or an administrator's reset): new keys, a new UID.
	sec := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: control.KeySecretName}, sec); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, sec); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Second) // a new key id
	fresh, err := (&control.SecretKeys{Client: k8s, Now: clock.Now}).Keys(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if sameKeys(fresh, first) {
		t.Fatal("the re-created Secret holds the old key")
	}
	// Within the TTL the cached keys are served...
	if got, _ := a.Keys(ctx, "team-a"); !sameKeys(got, first) {
		t.Fatalf("within the TTL: %s, want the cached %s", got.ActiveKeyId, first.ActiveKeyId)
	}
	// ...past it, the new Secret's.
	clock.Add(control.DefaultKeysTTL)
	for name, k := range map[string]*control.SecretKeys{"a": a, "b": b} {
		if got, err := k.Keys(ctx, "team-a"); err != nil || !sameKeys(got, fresh) {
			t.Fatalf("replica %s after the TTL: %v, %v; want the re-created Secret's key %s", name, got, err, fresh.ActiveKeyId)
		}
	}

	// A rotation on replica b: served by b at once, by a within the TTL.
	clock.Add(time.Second)
	rot, err := b.Rotate(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(rot.Keys) != 2 || rot.ActiveKeyId == fresh.ActiveKeyId {
		t.Fatalf("rotated: %v", rot)
	}
	if got, _ := b.Keys(ctx, "team-a"); !sameKeys(got, rot) {
		t.Fatalf("the rotating replica serves %s, want its new key %s", got.ActiveKeyId, rot.ActiveKeyId)
	}
	if got, _ := a.Keys(ctx, "team-a"); !sameKeys(got, fresh) {
		t.Fatalf("within the TTL: %s, want the cached %s", got.ActiveKeyId, fresh.ActiveKeyId)
	}
	clock.Add(control.DefaultKeysTTL)
	got, err := a.Keys(ctx, "team-a")
	if err != nil || !sameKeys(got, rot) {
		t.Fatalf("replica a after the TTL: %v, %v; want b's rotation (%s, 2 keys)", got, err, rot.ActiveKeyId)
	}
}

// gatedClient holds Gets of one namespace's Secret until the gate opens,
// and counts them.
type gatedClient struct {
	client.Client
	ns   string
	gate chan struct{}
	gets atomic.Int64
}

func (c *gatedClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Secret); ok && key.Namespace == c.ns {
		c.gets.Add(1)
		<-c.gate
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

func TestSecretKeysOneReadPerNamespace(t *testing.T) {
	k8s := keysAPI(t, "slow", "fast")
	ctx := context.Background()
	if _, err := (&control.SecretKeys{Client: k8s}).Keys(ctx, "slow"); err != nil { // the Secret exists
		t.Fatal(err)
	}
	gc := &gatedClient{Client: k8s, ns: "slow", gate: make(chan struct{})}
	keys := &control.SecretKeys{Client: gc}

	// Many callers for the slow namespace, one of which gives up.
	const callers = 16
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := keys.Keys(ctx, "slow")
			errs <- err
		}()
	}
	quitter, cancel := context.WithCancel(ctx)
	quit := make(chan error, 1)
	go func() { _, err := keys.Keys(quitter, "slow"); quit <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for gc.gets.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no read of the slow namespace's Secret began")
		}
		time.Sleep(time.Millisecond)
	}
	// Another namespace is served while that read hangs: no lock is held
	// across the API call.
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	defer fcancel()
	if _, err := keys.Keys(fctx, "fast"); err != nil {
		t.Fatalf("namespace fast waited for namespace slow's read: %v", err)
	}
	cancel()
	if err := <-quit; err != context.Canceled {
		t.Fatalf("the caller that gave up got %v, want context.Canceled", err)
	}
	close(gc.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a caller waiting for the shared read got %v (another caller giving up must not fail it)", err)
		}
	}
	if n := gc.gets.Load(); n != 1 {
		t.Errorf("%d reads of the slow namespace's Secret for %d callers, want 1", n, callers+1)
	}
}
