// Package tier holds objects outside pod memory: Redis is the fast tier
// (objects spill there when a pod's memory cap is reached), an
// S3-compatible store the slow tier (unread objects are backed up there when
// a pod terminates, and persisted objects live there). A consumer whose
// producer is gone reads through Redis, then S3.
package tier

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/dataplane/s3client"
)

// ErrNotFound means the tier does not hold the object.
var ErrNotFound = errors.New("object not in tier")

// Tier stores objects by id.
type Tier interface {
	Name() string
	Put(ctx context.Context, id string, data []byte, ttl time.Duration) error
	Get(ctx context.Context, id string) ([]byte, error)
	Delete(ctx context.Context, id string) error
}

// Redis is the fast tier.
type Redis struct {
	Client *redis.Client
	Prefix string // key prefix, e.g. "zt:obj:<namespace>:"
}

func (r *Redis) Name() string { return "redis" }

func (r *Redis) Put(ctx context.Context, id string, data []byte, ttl time.Duration) error {
	return r.Client.Set(ctx, r.Prefix+id, data, ttl).Err()
}

func (r *Redis) Get(ctx context.Context, id string) ([]byte, error) {
	b, err := r.Client.Get(ctx, r.Prefix+id).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redis %s: %w", id, ErrNotFound)
	}
	return b, err
}

func (r *Redis) Delete(ctx context.Context, id string) error {
	return r.Client.Del(ctx, r.Prefix+id).Err()
}

// S3 is the slow tier.
type S3 struct {
	Client *s3client.Client
	Bucket string
	Prefix string
}

func (s *S3) Name() string { return "s3" }

func (s *S3) Put(ctx context.Context, id string, data []byte, _ time.Duration) error {
	return s.Client.Put(ctx, s.Bucket, s.Prefix+id, data)
}

func (s *S3) Get(ctx context.Context, id string) ([]byte, error) {
	b, err := s.Client.Get(ctx, s.Bucket, s.Prefix+id)
	if errors.Is(err, s3client.ErrNotFound) {
		return nil, fmt.Errorf("s3 %s: %w", id, ErrNotFound)
	}
	return b, err
}

func (s *S3) Delete(ctx context.Context, id string) error {
	return s.Client.Delete(ctx, s.Bucket, s.Prefix+id)
}

// Chain reads through tiers in order (Redis, then S3).
type Chain []Tier

// Get returns the object from the first tier that has it.
func (c Chain) Get(ctx context.Context, id string) ([]byte, string, error) {
	var errs []error
	for _, t := range c {
		b, err := t.Get(ctx, id)
		if err == nil {
			return b, t.Name(), nil
		}
		errs = append(errs, err)
	}
	if len(c) == 0 {
		return nil, "", fmt.Errorf("%s: %w (no storage tier configured)", id, ErrNotFound)
	}
	return nil, "", fmt.Errorf("%s: %w", id, errors.Join(errs...))
}
