package control

import (
	"context"
	"crypto/rand"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// KeySecretName is the Secret, one per namespace, that holds the AES-256-GCM
// keys sealing that namespace's object references. Keeping keys per
// namespace means a reference leaked from one namespace opens nothing in
// another.
const KeySecretName = "ziptrail-reference-keys"

// activeKeyField names the Secret entry holding the id of the sealing key;
// every other entry is a key, named by its id.
const activeKeyField = "active"

// DefaultKeysTTL is SecretKeys.TTL's default.
const DefaultKeysTTL = 30 * time.Second

// keysLoadTimeout bounds one read (or creation) of a namespace's Secret.
const keysLoadTimeout = 30 * time.Second

// SecretKeys stores reference keys in Secrets, creating them on first use.
//
// A namespace's keys are served from memory for TTL, then the Secret is
// read again: a Secret deleted and created again (a namespace re-created
// under the same name) or rotated by another operator replica is served
// here at most TTL later. A read that finds the Secret unchanged (same
// UID and resourceVersion) keeps the keys it had (the same *Keys, so
// keyrings built from them are kept too). One read per namespace is in
// flight at a time, whatever the number of callers waiting for it, and no
// lock is held while it runs: a slow API server delays only that
// namespace's callers. A read that fails for another reason than the
// Secret being absent serves the keys read before, if any, and is tried
// again after at most staleRetry.
type SecretKeys struct {
	Client client.Client
	// Now is the clock of the cache and of key ids (tests); default time.Now.
	Now func() time.Time
	// TTL is how long keys are served without reading the Secret again;
	// default DefaultKeysTTL.
	TTL time.Duration

	mu    sync.Mutex
	cache map[string]*keysEntry
	loads map[string]*keysLoad // reads in flight, by namespace
	gen   map[string]uint64    // bumped by every store: an older read does not overwrite a newer result
}

// keysEntry is a namespace's keys as last read.
type keysEntry struct {
	keys    *controlv1.Keys
	uid     types.UID
	version string // the Secret's resourceVersion
	expires time.Time
}

// keysLoad is a read in flight: done is closed once keys or err are set.
type keysLoad struct {
	done chan struct{}
	keys *controlv1.Keys
	err  error
}

// staleRetry is how soon a read that failed (keys served stale) is tried again.
const staleRetry = 5 * time.Second

func (k *SecretKeys) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

func (k *SecretKeys) ttl() time.Duration {
	if k.TTL > 0 {
		return k.TTL
	}
	return DefaultKeysTTL
}

// Keys returns the namespace's keys, creating the Secret when absent. The
// result is shared: callers must not modify it.
func (k *SecretKeys) Keys(ctx context.Context, namespace string) (*controlv1.Keys, error) {
	k.mu.Lock()
	e := k.cache[namespace]
	if e != nil && k.now().Before(e.expires) {
		k.mu.Unlock()
		return e.keys, nil
	}
	l := k.loads[namespace]
	if l == nil {
		if k.loads == nil {
			k.loads = map[string]*keysLoad{}
		}
		l = &keysLoad{done: make(chan struct{})}
		k.loads[namespace] = l
		// The read runs on its own: a caller that gives up (its context
		// ends) does not fail the others waiting for it.
		go k.load(context.WithoutCancel(ctx), namespace, l, e, k.gen[namespace])
	}
	k.mu.Unlock()
	select {
	case <-l.done:
		return l.keys, l.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// load reads (or creates) the namespace's Secret and caches its keys.
func (k *SecretKeys) load(ctx context.Context, namespace string, l *keysLoad, prev *keysEntry, gen uint64) {
	ctx, cancel := context.WithTimeout(ctx, keysLoadTimeout)
	defer cancel()
	sec, err := k.read(ctx, namespace)
	var e *keysEntry
	if err == nil {
		e, err = k.entry(sec, prev)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.loads, namespace)
	cur := k.cache[namespace]
	switch {
	case k.gen[namespace] != gen && cur != nil:
		l.keys = cur.keys // a Rotate stored newer keys meanwhile
	case err == nil:
		k.store(namespace, e)
		l.keys = e.keys
	case prev != nil && !apierrors.IsNotFound(err):
		// The API server could not be asked (or the Secret is damaged):
		// the keys read before are still the best answer; ask again soon.
		prev.expires = k.now().Add(min(staleRetry, k.ttl()))
		k.cache[namespace] = prev
		l.keys = prev.keys
	default:
		delete(k.cache, namespace)
		l.err = err
	}
	close(l.done)
}

// read gets the namespace's Secret, creating it when absent.
func (k *SecretKeys) read(ctx context.Context, namespace string) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	err := k.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: KeySecretName}, sec)
	if !apierrors.IsNotFound(err) {
		return sec, err
	}
	sec, err = k.create(ctx, namespace)
	if apierrors.IsAlreadyExists(err) { // another replica won the race
		sec = &corev1.Secret{}
		err = k.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: KeySecretName}, sec)
	}
	return sec, err
}

// entry is the cache entry of a Secret read: prev's keys when the Secret
// did not change since.
func (k *SecretKeys) entry(sec *corev1.Secret, prev *keysEntry) (*keysEntry, error) {
	e := &keysEntry{uid: sec.UID, version: sec.ResourceVersion, expires: k.now().Add(k.ttl())}
	if prev != nil && prev.uid == sec.UID && prev.version == sec.ResourceVersion && sec.ResourceVersion != "" {
		e.keys = prev.keys
		return e, nil
	}
	keys, err := parseKeySecret(sec)
	if err != nil {
		return nil, err
	}
	e.keys = keys
	return e, nil
}

// store caches e (under k.mu).
func (k *SecretKeys) store(namespace string, e *keysEntry) {
	if k.cache == nil {
		k.cache = map[string]*keysEntry{}
	}
	if k.gen == nil {
		k.gen = map[string]uint64{}
	}
	k.cache[namespace] = e
	k.gen[namespace]++
}

// Rotate adds a new sealing key to the namespace and keeps the previous ones
// so references sealed before still open until they expire. Other replicas
// serve the new key within their TTL.
func (k *SecretKeys) Rotate(ctx context.Context, namespace string) (*controlv1.Keys, error) {
	var sec *corev1.Secret
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sec = &corev1.Secret{}
		if err := k.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: KeySecretName}, sec); err != nil {
			return err
		}
		id, secret, err := k.newKey()
		if err != nil {
			return err
		}
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		sec.Data[id] = secret
		sec.Data[activeKeyField] = []byte(id)
		return k.Client.Update(ctx, sec)
	})
	if err != nil {
		return nil, err
	}
	e, err := k.entry(sec, nil)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.store(namespace, e)
	k.mu.Unlock()
	return e.keys, nil
}

func (k *SecretKeys) create(ctx context.Context, namespace string) (*corev1.Secret, error) {
	id, secret, err := k.newKey()
	if err != nil {
		return nil, err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: KeySecretName, Namespace: namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "ziptrail"}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{id: secret, activeKeyField: []byte(id)},
	}
	return sec, k.Client.Create(ctx, sec)
}

// newKey makes a random 256-bit key with a time-ordered id.
func (k *SecretKeys) newKey() (string, []byte, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return "", nil, err
	}
	return "k" + strconv.FormatInt(k.now().UnixNano(), 36), secret, nil
}

func parseKeySecret(sec *corev1.Secret) (*controlv1.Keys, error) {
	active := string(sec.Data[activeKeyField])
	keys := &controlv1.Keys{ActiveKeyId: active}
	ids := make([]string, 0, len(sec.Data))
	for id := range sec.Data {
		if id != activeKeyField {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		if len(sec.Data[id]) != 32 {
			return nil, fmt.Errorf("secret %s/%s: key %s is %d bytes, want 32", sec.Namespace, sec.Name, id, len(sec.Data[id]))
		}
		keys.Keys = append(keys.Keys, &controlv1.Key{Id: id, Secret: sec.Data[id]})
	}
	if _, ok := sec.Data[active]; !ok || active == "" {
		return nil, fmt.Errorf("secret %s/%s: active key %q is missing", sec.Namespace, sec.Name, active)
	}
	return keys, nil
}
