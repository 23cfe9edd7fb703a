// Package checkpoint stores the operator's trigger-engine snapshots in
// Redis, so a restarted (or newly elected) operator resumes every session
// where the previous one stopped. A snapshot is written under a generation
// number; a writer that lost leadership cannot overwrite a newer one.
package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ErrStale means a newer generation was already saved (another leader).
var ErrStale = errors.New("checkpoint: a newer snapshot exists; this writer is no longer the leader")

// Store saves and loads snapshots under one key.
type Store struct {
	Client *redis.Client
	Key    string // e.g. "ziptrail:engine:snapshot"
	// Writer names this writer in what it stores (default: random, one
	// per Store), so that a retried write whose first attempt landed reads
	// as done rather than as another writer's (ErrStale).
	Writer   string
	initOnce sync.Once
}

// NewWriter is a Store of the same key and client as s, writing as a new
// writer: one per owner of the checkpoint.
func (s *Store) NewWriter() *Store { return &Store{Client: s.Client, Key: s.Key} }

func (s *Store) writer() string {
	s.initOnce.Do(func() {
		if s.Writer == "" {
			var b [12]byte
			_, _ = rand.Read(b[:])
			s.Writer = hex.EncodeToString(b[:])
		}
	})
	return s.Writer
}

// save writes data at generation gen only if the stored generation is
// older, or is this writer's own (a write that landed, repeated).
var save = redis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], 'gen') or '-1')
local mine = cur == tonumber(ARGV[1]) and redis.call('HGET', KEYS[1], 'writer') == ARGV[3]
if not mine and cur >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'data', ARGV[2], 'writer', ARGV[3])
return 1
`)

// Save stores data as generation gen (monotonic per writer, e.g. a counter
// seeded from Load's generation). A writer whose save failed saves again
// at the same generation: if the failed one landed, the new data replaces
// it; if another owner claimed meanwhile, it is refused (ErrStale).
func (s *Store) Save(ctx context.Context, gen int64, data []byte) error {
	ok, err := save.Run(ctx, s.Client, []string{s.Key}, gen, data, s.writer()).Int()
	if err != nil {
		return fmt.Errorf("checkpoint: save: %w", err)
	}
	if ok == 0 {
		return ErrStale
	}
	return nil
}

// Load returns the latest snapshot and its generation; found is false when
// none was ever saved.
func (s *Store) Load(ctx context.Context) (data []byte, gen int64, found bool, err error) {
	vals, err := s.Client.HMGet(ctx, s.Key, "gen", "data").Result()
	if err != nil {
		return nil, 0, false, fmt.Errorf("checkpoint: load: %w", err)
	}
	if vals[0] == nil {
		return nil, 0, false, nil
	}
	g, err := strconv.ParseInt(vals[0].(string), 10, 64)
	if err != nil {
		return nil, 0, false, fmt.Errorf("checkpoint: corrupt generation %q", vals[0])
	}
	d, _ := vals[1].(string)
	return []byte(d), g, true, nil
}
