package sharding

import (
	"context"
	"net"
	"sort"
)

// Router sends a workflow's traffic (control streams, gateway calls) to
// the replica that owns its bucket: every replica serves the same port.
type Router struct {
	Set *Set
	// Serving reports whether this replica serves workflow ns/name now.
	Serving func(namespace, name string) bool
	// Port is the service's port on every replica.
	Port string
}

// Route is where workflow namespace/name's traffic goes: "" when it is
// served here, else the owner's host:port. ErrNoOwner when nobody serves
// its bucket at the moment (being taken over, or this replica is still
// loading it).
func (r *Router) Route(ctx context.Context, namespace, name string) (addr, bucket string, err error) {
	bucket = r.Set.BucketOf(namespace, name)
	if r.Serving(namespace, name) {
		return "", bucket, nil
	}
	owner, err := r.Set.Owner(ctx, bucket)
	if err != nil {
		return "", bucket, err
	}
	if owner == r.Set.Identity() {
		r.Set.Forget(bucket) // held here but not served (yet, or any more)
		return "", bucket, ErrNoOwner
	}
	return net.JoinHostPort(owner, r.Port), bucket, nil
}

// Peers are the other replicas that own buckets now (host:port), for
// requests that span every bucket (listing a namespace's sessions).
func (r *Router) Peers(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	for _, b := range r.Set.Names() {
		owner, err := r.Set.Owner(ctx, b)
		if err == ErrNoOwner {
			continue
		}
		if err != nil {
			return nil, err
		}
		if owner != r.Set.Identity() {
			seen[net.JoinHostPort(owner, r.Port)] = true
		}
	}
	out := make([]string, 0, len(seen))
	for a := range seen {
		out = append(out, a)
	}
	sort.Strings(out)
	return out, nil
}
