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
// control.KeySecretName Secret, and re-read when a reference names a key id
// it does not know (rotation).
//
// References are user input (a request header), so reading keys is bounded:
// a namespace's Secret is read by one caller at a time (the others wait for
// that read, no lock is held across it, other namespaces go on), and at most
// once per MinReread for key ids it lacks and after a failed read. The
// namespace's last read is the cache, positive and negative at once: every
// key id it lacks is a miss until MinReread has passed, so forged references
// under random key ids cost no API reads and no memory per id.
type DataPlaneExtender struct {
	Secrets SecretGetter
	// MinReread is the least time between two reads of a namespace's key
	// Secret; default 5s (the keep-alive interval).
	MinReread time.Duration
	Now       func() time.Time

	mu sync.Mutex // guards namespaces only, never held across a read
	ns map[string]*nsKeys
}

// nsKeys is a namespace's keys: a pull client with its keyring and the
// state of the last read of the namespace's key Secret.
type nsKeys struct {
	mu      sync.Mutex
	client  *pull.Client  // nil until a read succeeded
	readAt  time.Time     // start of the last completed read
	err     error         // that read's error
	loading chan struct{} // closed when the read in flight ends
}

// secretReadTimeout bounds one read of a key Secret; the read does not end
// with the request that started it, since others may be waiting for it.
const secretReadTimeout = 10 * time.Second

// Extend is an ExtendFunc.
func (d *DataPlaneExtender) Extend(ctx context.Context, namespace, r string, until time.Time) error {
	if namespace == "" {
		return fmt.Errorf("%w: request has no namespace to open references in", ErrGone)
	}
	asked := d.now()
	c, _, err := d.keys(ctx, namespace, time.Time{})
	if c == nil {
		return fmt.Errorf("reference keys of namespace %s: %w", namespace, err)
	}
	ok, err := c.Extend(ctx, r, until)
	if errors.Is(err, ref.ErrUnknownKey) {
		// Rotation, or a forgery: only a read begun after this call
		// started can tell.
		c, readAt, rerr := d.keys(ctx, namespace, asked)
		if ok, err = c.Extend(ctx, r, until); errors.Is(err, ref.ErrUnknownKey) && (rerr != nil || readAt.Before(asked)) {
			return fmt.Errorf("%v, as of the key Secret read at %s (read again %v after it at the earliest): retrying later",
				err, readAt.UTC().Format(time.RFC3339), d.minReread())
		}
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

func (d *DataPlaneExtender) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

func (d *DataPlaneExtender) minReread() time.Duration {
	if d.MinReread > 0 {
		return d.MinReread
	}
	return 5 * time.Second
}

func (d *DataPlaneExtender) namespace(ns string) *nsKeys {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ns == nil {
		d.ns = map[string]*nsKeys{}
	}
	k, ok := d.ns[ns]
	if !ok {
		k = &nsKeys{}
		d.ns[ns] = k
	}
	return k
}

// keys returns the namespace's client (nil while no read has succeeded),
// the start of the read it reflects and that read's error. It reads the
// Secret when it never was, or when the last read began before `since` (a
// caller needing keys newer than its own start) or failed, and MinReread
// has passed since; otherwise it answers from the last read.
func (d *DataPlaneExtender) keys(ctx context.Context, ns string, since time.Time) (*pull.Client, time.Time, error) {
	k := d.namespace(ns)
	k.mu.Lock()
	for k.loading != nil {
		wait := k.loading
		k.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		}
		k.mu.Lock()
	}
	now := d.now()
	read := !k.readAt.IsZero()
	current := read && k.err == nil && !k.readAt.Before(since)
	if read && (current || now.Sub(k.readAt) < d.minReread()) {
		defer k.mu.Unlock()
		return k.client, k.readAt, k.err
	}
	done := make(chan struct{})
	k.loading = done
	k.mu.Unlock()

	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), secretReadTimeout)
	keys, active, err := d.read(rctx, ns)
	cancel()

	k.mu.Lock()
	defer k.mu.Unlock()
	k.readAt, k.err, k.loading = now, err, nil
	close(done)
	switch {
	case err != nil: // keep the keys read before, if any
	case k.client == nil:
		var kr *ref.Keyring
		if kr, k.err = ref.NewKeyring(ns, keys, active); k.err == nil {
			k.client = &pull.Client{Keys: kr}
		}
	default:
		k.err = k.client.Keys.Set(keys, active)
	}
	return k.client, k.readAt, k.err
}

func (d *DataPlaneExtender) read(ctx context.Context, ns string) (map[string][]byte, string, error) {
	sec, err := d.Secrets(ctx, ns, control.KeySecretName)
	if err != nil {
		return nil, "", err
	}
	return ParseKeySecret(sec)
}

// Close drops the producer connections.
func (d *DataPlaneExtender) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, k := range d.ns {
		k.mu.Lock()
		if k.client != nil {
			k.client.Close()
		}
		k.mu.Unlock()
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
