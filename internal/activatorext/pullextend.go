package activatorext

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ziptrail/ziptrail/internal/control"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

// SecretGetter reads a Secret (the activator's kube client, read-only).
type SecretGetter func(ctx context.Context, namespace, name string) (*corev1.Secret, error)

// DataPlaneExtender extends references at their producers over the data
// plane (the producer's Cap'n Proto `extend` call). A reference names its
// producer only inside its sealed record, so the extender opens it with the
// namespace's reference keys, read from the namespace's
// control.KeySecretName Secret (and re-read when a reference names a key
// it does not know yet: rotation).
type DataPlaneExtender struct {
	Secrets SecretGetter

	mu      sync.Mutex
	clients map[string]*pull.Client // namespace -> client with its keyring
}

// Extend is an ExtendFunc.
func (d *DataPlaneExtender) Extend(ctx context.Context, namespace, r string, until time.Time) error {
	if namespace == "" {
		return fmt.Errorf("%w: request has no namespace to open references in", ErrGone)
	}
	c, err := d.client(ctx, namespace, false)
	if err != nil {
		return err
	}
	ok, err := c.Extend(ctx, r, until)
	if errors.Is(err, ref.ErrUnknownKey) {
		if c, err = d.client(ctx, namespace, true); err != nil {
			return err
		}
		ok, err = c.Extend(ctx, r, until)
	}
	switch {
	case err != nil && permanent(err):
		return fmt.Errorf("%w: %v", ErrGone, err)
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%w: producer no longer holds the object", ErrGone)
	}
	return nil
}

func permanent(err error) bool {
	for _, e := range []error{ref.ErrMalformed, ref.ErrUnknownKey, ref.ErrTampered, ref.ErrExpired, ref.ErrForeign,
		pull.ErrNotFound, pull.ErrExhausted, pull.ErrExpired} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// client returns the namespace's pull client, (re)loading its keys when
// absent or when refresh is set.
func (d *DataPlaneExtender) client(ctx context.Context, namespace string, refresh bool) (*pull.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.clients[namespace]
	if ok && !refresh {
		return c, nil
	}
	sec, err := d.Secrets(ctx, namespace, control.KeySecretName)
	if err != nil {
		return nil, fmt.Errorf("reference keys of namespace %s: %w", namespace, err)
	}
	keys, active, err := ParseKeySecret(sec)
	if err != nil {
		return nil, err
	}
	if ok {
		return c, c.Keys.Set(keys, active)
	}
	kr, err := ref.NewKeyring(namespace, keys, active)
	if err != nil {
		return nil, err
	}
	if d.clients == nil {
		d.clients = map[string]*pull.Client{}
	}
	c = &pull.Client{Keys: kr}
	d.clients[namespace] = c
	return c, nil
}

// Close drops the producer connections.
func (d *DataPlaneExtender) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.clients {
		c.Close()
	}
}

// ParseKeySecret reads a reference-key Secret as the operator writes it
// (internal/control): entry "active" names the sealing key, every other
// entry is a 32-byte key named by its id.
func ParseKeySecret(sec *corev1.Secret) (map[string][]byte, string, error) {
	active := string(sec.Data["active"])
	keys := map[string][]byte{}
	for id, v := range sec.Data {
		if id != "active" {
			keys[id] = v
		}
	}
	if _, ok := keys[active]; !ok || active == "" {
		return nil, "", fmt.Errorf("secret %s/%s: active key %q is missing", sec.Namespace, sec.Name, active)
	}
	return keys, active, nil
}
