package ziptrail

import (
	"context"
	"fmt"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
)

// Tier is a storage tier the sidecar reaches for its pod: the fast tier
// (Redis) or the slow tier (S3). The shuffle library (package shuffle)
// keeps partitions there.
type Tier string

const (
	TierFast Tier = "fast" // Redis
	TierSlow Tier = "slow" // S3
)

func (t Tier) proto(op string) (sidecarv1.Tier, error) {
	switch t {
	case TierFast, "redis":
		return sidecarv1.Tier_TIER_FAST, nil
	case TierSlow, "s3":
		return sidecarv1.Tier_TIER_SLOW, nil
	}
	return 0, &Error{Kind: KindInvalid, Op: op, Err: fmt.Errorf("tier must be %q (Redis) or %q (S3), got %q", TierFast, TierSlow, string(t))}
}

// TierPut writes data under key in a tier through the sidecar, which holds
// the tiers' endpoints and credentials; keys are scoped to the pod's
// namespace and the session (the context's invocation's, or
// WithSession's). WithTTL (fast tier only) overrides the sidecar's object
// lifetime. It returns the size written. A tier the sidecar has not
// configured is ErrUnavailable.
func (c *Client) TierPut(ctx context.Context, tier Tier, key string, data []byte, opts ...Option) (int64, error) {
	t, err := tier.proto("tier put")
	if err != nil {
		return 0, err
	}
	o := collect(ctx, opts)
	if o.ttl < 0 {
		return 0, &Error{Kind: KindInvalid, Op: "tier put", Err: fmt.Errorf("ttl must be positive, got %v", o.ttl)}
	}
	p, err := c.api.Payload(data)
	if err != nil {
		return 0, &Error{Kind: KindInternal, Op: "tier put", Err: err}
	}
	resp, err := c.api.RPC().TierPut(ctx, &sidecarv1.TierPutRequest{Tier: t, Session: o.session, Key: key, Object: p, TtlMs: o.ttl.Milliseconds()})
	if err != nil {
		discard(p)
		return 0, rpcError(ctx, "tier put", err)
	}
	return resp.GetSize(), nil
}

// TierGet reads key of the session from a tier (see TierPut); a missing
// key is ErrNotFound. A large object is a mapping of the file the sidecar
// wrote it to: Close it when done.
func (c *Client) TierGet(ctx context.Context, tier Tier, key string, opts ...Option) (*Object, error) {
	t, err := tier.proto("tier get")
	if err != nil {
		return nil, err
	}
	resp, err := c.api.RPC().TierGet(ctx, &sidecarv1.TierGetRequest{Tier: t, Session: collect(ctx, opts).session, Key: key})
	if err != nil {
		return nil, rpcError(ctx, "tier get", err)
	}
	return c.object("tier get", resp)
}

// TierDelete removes keys of the session from a tier; missing keys are not
// an error.
func (c *Client) TierDelete(ctx context.Context, tier Tier, keys []string, opts ...Option) error {
	t, err := tier.proto("tier delete")
	if err != nil {
		return err
	}
	_, err = c.api.RPC().TierDelete(ctx, &sidecarv1.TierDeleteRequest{Tier: t, Session: collect(ctx, opts).session, Keys: keys})
	return rpcError(ctx, "tier delete", err)
}
