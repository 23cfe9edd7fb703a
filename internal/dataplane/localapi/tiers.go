package localapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
)

// The shuffle storage calls (docs/shuffle.md): a function's partitions in
// the fast or the slow tier, through the sidecar that holds the tiers'
// credentials. Keys live under shuffle/<session>/ in the tier's
// namespace-scoped space (the tiers' prefixes name the namespace).

// errTierUnavailable: the asked tier is not configured for this pod.
var errTierUnavailable = errors.New("storage tier not configured")

// maxTierKey bounds a key.
const maxTierKey = 512

func (s *Server) storageTier(t sidecarv1.Tier) (tier.Tier, error) {
	var out tier.Tier
	switch t {
	case sidecarv1.Tier_TIER_FAST:
		out = s.Fast
	case sidecarv1.Tier_TIER_SLOW:
		out = s.Persist
	default:
		return nil, fmt.Errorf("%w: tier %v: name TIER_FAST or TIER_SLOW", ErrBadPayload, t)
	}
	if c, ok := out.(interface{ Configured() bool }); out == nil || ok && !c.Configured() {
		return nil, fmt.Errorf("%w: %v", errTierUnavailable, t)
	}
	return out, nil
}

func tierID(session, key string) (string, error) {
	switch {
	case session == "" || strings.ContainsAny(session, "/\x00"):
		return "", fmt.Errorf("%w: session %q (required, no '/')", ErrBadPayload, session)
	case key == "" || len(key) > maxTierKey || strings.ContainsRune(key, 0):
		return "", fmt.Errorf("%w: key of %d bytes (1..%d, no NUL)", ErrBadPayload, len(key), maxTierKey)
	}
	return "shuffle/" + session + "/" + key, nil
}

func (s *Server) TierPut(ctx context.Context, req *sidecarv1.TierPutRequest) (*sidecarv1.TierPutResponse, error) {
	t, err := s.storageTier(req.GetTier())
	if err != nil {
		return nil, toStatus(err)
	}
	id, err := tierID(req.GetSession(), req.GetKey())
	if err != nil {
		return nil, toStatus(err)
	}
	data, release, err := s.load(ctx, req.GetObject())
	if err != nil {
		return nil, toStatus(err)
	}
	defer release()
	ttl := time.Duration(req.GetTtlMs()) * time.Millisecond
	if ttl <= 0 {
		ttl = s.ttl(0)
	}
	if err := t.Put(ctx, id, data, ttl); err != nil {
		return nil, toStatus(err)
	}
	return &sidecarv1.TierPutResponse{Size: int64(len(data))}, nil
}

func (s *Server) TierGet(ctx context.Context, req *sidecarv1.TierGetRequest) (*sidecarv1.GetResponse, error) {
	t, err := s.storageTier(req.GetTier())
	if err != nil {
		return nil, toStatus(err)
	}
	id, err := tierID(req.GetSession(), req.GetKey())
	if err != nil {
		return nil, toStatus(err)
	}
	data, err := t.Get(ctx, id)
	if err != nil {
		return nil, toStatus(err)
	}
	return s.respond(ctx, data, t.Name())
}

func (s *Server) TierDelete(ctx context.Context, req *sidecarv1.TierDeleteRequest) (*sidecarv1.TierDeleteResponse, error) {
	t, err := s.storageTier(req.GetTier())
	if err != nil {
		return nil, toStatus(err)
	}
	var errs []error
	for _, k := range req.GetKeys() {
		id, err := tierID(req.GetSession(), k)
		if err == nil {
			err = t.Delete(ctx, id)
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, toStatus(err)
	}
	return &sidecarv1.TierDeleteResponse{}, nil
}
