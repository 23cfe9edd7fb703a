package activatorext

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

// KeyGetter reads a namespace's reference keys (by id) and the id of the
// active one. In activator-ext it asks the operator's control service
// (OperatorKeys), authenticated with the activator's projected
// service-account token; the operator allow-lists that ServiceAccount.
type KeyGetter func(ctx context.Context, namespace string) (keys map[string][]byte, active string, err error)

// OperatorKeys is a KeyGetter over the operator's GetKeys call.
func OperatorKeys(c *controlclient.KeysClient) KeyGetter {
	return func(ctx context.Context, ns string) (map[string][]byte, string, error) {
		k, err := c.Keys(ctx, ns)
		if err != nil {
			return nil, "", err
		}
		keys := make(map[string][]byte, len(k.Keys))
		for _, key := range k.Keys {
			keys[key.Id] = key.Secret
		}
		if _, ok := keys[k.ActiveKeyId]; !ok || k.ActiveKeyId == "" {
			return nil, "", fmt.Errorf("the operator's keys of namespace %s lack the active key %q", ns, k.ActiveKeyId)
		}
		return keys, k.ActiveKeyId, nil
	}
}

// DataPlaneExtender extends references at their producers over the data
// plane (an extend request on the producer's pull stream). A reference names its
// producer only inside its sealed record, so the extender opens it with the
// namespace's reference keys, read through Keys (the operator), and read
// again when a reference names a key id it does not know (rotation).
//
// References are user input (a request header), so reading keys is bounded:
// a namespace's keys are read by one caller at a time (the others wait for
// that read, no lock is held across it, other namespaces go on), and at most
// once per MinReread for key ids it lacks and after a failed read. The
// namespace's last read is the cache, positive and negative at once: every
// key id it lacks is a miss until MinReread has passed, so forged references
// under random key ids cost no reads and no memory per id.
type DataPlaneExtender struct {
	Keys KeyGetter
	// MinReread is the least time between two reads of a namespace's
	// keys; default 5s (the keep-alive interval).
	MinReread time.Duration
	Now       func() time.Time

	mu sync.Mutex // guards namespaces only, never held across a read
	ns map[string]*nsKeys
}

// nsKeys is a namespace's keys: a pull client with its keyring and the
// state of the last read of the namespace's keys.
type nsKeys struct {
	mu      sync.Mutex
	client  *pull.Client  // nil until a read succeeded
	readAt  time.Time     // start of the last completed read
	err     error         // that read's error
	loading chan struct{} // closed when the read in flight ends
}

// secretReadTimeout bounds one read of a namespace's keys; the read does not end
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
		if c == nil {
			// This call's time ended while it waited for another caller's
			// read (it has no client then): retryable, like any unknown
			// key id not yet read for. Never use a nil client (issue 31).
			return fmt.Errorf("%v; the keys of namespace %s could not be read again: %v: retrying later", err, namespace, rerr)
		}
		if ok, err = c.Extend(ctx, r, until); errors.Is(err, ref.ErrUnknownKey) && (rerr != nil || readAt.Before(asked)) {
			return fmt.Errorf("%v, as of the keys read at %s (read again %v after it at the earliest): retrying later",
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
// keys when they never were read, or when the last read began before `since` (a
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
	return d.Keys(ctx, ns)
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
