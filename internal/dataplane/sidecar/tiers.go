package sidecar

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/dataplane/s3client"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// TiersFrom builds the tier clients the operator described on the control
// stream; empty endpoints leave that tier nil (disabled). Objects of the
// namespace are kept under its prefix in both tiers.
func TiersFrom(t *controlv1.Tiers, namespace string) (*tier.Redis, *tier.S3, error) {
	var r *tier.Redis
	var s *tier.S3
	if t.GetRedisAddr() != "" {
		r = &tier.Redis{Client: redis.NewClient(&redis.Options{Addr: t.GetRedisAddr(), Password: t.GetRedisPassword()}),
			Prefix: "zt:obj:" + namespace + ":"}
	}
	if t.GetS3Endpoint() != "" {
		mc, err := s3client.New(s3client.Config{Endpoint: t.GetS3Endpoint(), AccessKey: t.GetS3AccessKey(), SecretKey: t.GetS3SecretKey(),
			Secure: t.GetS3Tls()})
		if err != nil {
			return nil, nil, fmt.Errorf("S3 tier %s: %w", t.GetS3Endpoint(), err)
		}
		bucket := t.GetS3Bucket()
		if bucket == "" {
			bucket = "ziptrail"
		}
		s = &tier.S3{Client: mc, Bucket: bucket, Prefix: namespace + "/"}
	}
	return r, s, nil
}

// setTiers installs the tiers the operator sent. The first message wins:
// the operator sends them before the keys, so they are in place before
// the sidecar serves anything, and tier clients are not swapped under
// running transfers later (a changed tier config takes a new pod). Tiers
// given in the Config (tests, --standalone) take precedence.
func (s *Sidecar) setTiers(t *controlv1.Tiers) {
	if s.cfg.Redis != nil || s.cfg.S3 != nil || s.tiersSet.Swap(true) {
		return
	}
	r, s3, err := TiersFrom(t, s.cfg.Namespace)
	if err != nil {
		if s.cfg.Log != nil {
			s.cfg.Log(fmt.Errorf("storage tiers from the operator: %w", err))
		}
		return
	}
	if r != nil {
		s.redis.Store(r)
		// Before the keys arrive nothing has been put yet (puts seal
		// references, which waits for the keys).
		s.Store.Spill = s.spill
	}
	if s3 != nil {
		s.s3.Store(s3)
	}
}

func (s *Sidecar) spill(ctx context.Context, m store.Meta, data []byte) error {
	r := s.redis.Load()
	if r == nil {
		return fmt.Errorf("%s: no fast tier (Redis) configured", m.ID)
	}
	err := r.Put(ctx, m.ID, data, time.Until(m.Expires))
	spills.WithLabelValues(result(err)).Inc()
	if err == nil {
		spilledBytes.Add(float64(len(data)))
	}
	return err
}

// liveTier is a tier that may be configured after the servers started
// (from the operator's control stream).
type liveTier struct {
	name string
	get  func() tier.Tier
}

func (l liveTier) Name() string { return l.name }

// Configured tells whether the operator sent this tier (yet).
func (l liveTier) Configured() bool { return l.get() != nil }

func (l liveTier) Put(ctx context.Context, id string, data []byte, ttl time.Duration) error {
	if t := l.get(); t != nil {
		return t.Put(ctx, id, data, ttl)
	}
	return fmt.Errorf("%s: no %s tier configured", id, l.name)
}

func (l liveTier) Get(ctx context.Context, id string) ([]byte, error) {
	if t := l.get(); t != nil {
		return t.Get(ctx, id)
	}
	return nil, fmt.Errorf("%s %s: %w (no %s tier configured)", l.name, id, tier.ErrNotFound, l.name)
}

func (l liveTier) Delete(ctx context.Context, id string) error {
	if t := l.get(); t != nil {
		return t.Delete(ctx, id)
	}
	return nil
}

func (s *Sidecar) liveRedis() liveTier {
	return liveTier{name: "redis", get: func() tier.Tier {
		if r := s.redis.Load(); r != nil {
			return r
		}
		return nil
	}}
}

func (s *Sidecar) liveS3() liveTier {
	return liveTier{name: "s3", get: func() tier.Tier {
		if t := s.s3.Load(); t != nil {
			return t
		}
		return nil
	}}
}
