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
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/control/controlv1"
)

// KeySecretName is the Secret, one per namespace, that holds the AES-256-GCM
// keys sealing that namespace's object references. Keeping keys per
// namespace means a reference leaked from one namespace opens nothing in
// another.
const KeySecretName = "ziptrail-reference-keys"

// activeKeyField names the Secret entry holding the id of the sealing key;
// every other entry is a key, named by its id.
const activeKeyField = "active"

// SecretKeys stores reference keys in Secrets, creating them on first use.
type SecretKeys struct {
	Client client.Client
	Now    func() time.Time

	mu    sync.Mutex
	cache map[string]*controlv1.Keys
}

// Keys returns the namespace's keys, creating the Secret when absent.
func (k *SecretKeys) Keys(ctx context.Context, namespace string) (*controlv1.Keys, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if keys, ok := k.cache[namespace]; ok {
		return keys, nil
	}
	sec := &corev1.Secret{}
	err := k.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: KeySecretName}, sec)
	switch {
	case apierrors.IsNotFound(err):
		sec, err = k.create(ctx, namespace)
		if apierrors.IsAlreadyExists(err) { // another replica won the race
			err = k.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: KeySecretName}, sec)
		}
		if err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	}
	keys, err := parseKeySecret(sec)
	if err != nil {
		return nil, err
	}
	if k.cache == nil {
		k.cache = map[string]*controlv1.Keys{}
	}
	k.cache[namespace] = keys
	return keys, nil
}

// Rotate adds a new sealing key to the namespace and keeps the previous ones
// so references sealed before still open until they expire.
func (k *SecretKeys) Rotate(ctx context.Context, namespace string) (*controlv1.Keys, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	sec := &corev1.Secret{}
	if err := k.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: KeySecretName}, sec); err != nil {
		return nil, err
	}
	id, secret, err := k.newKey()
	if err != nil {
		return nil, err
	}
	sec.Data[id] = secret
	sec.Data[activeKeyField] = []byte(id)
	if err := k.Client.Update(ctx, sec); err != nil {
		return nil, err
	}
	keys, err := parseKeySecret(sec)
	if err != nil {
		return nil, err
	}
	if k.cache == nil {
		k.cache = map[string]*controlv1.Keys{}
	}
	k.cache[namespace] = keys
	return keys, nil
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
	now := time.Now
	if k.Now != nil {
		now = k.Now
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return "", nil, err
	}
	return "k" + strconv.FormatInt(now().UnixNano(), 36), secret, nil
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
