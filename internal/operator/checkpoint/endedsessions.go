package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Ended sessions are written once each, beside the snapshot, rather than
// in every snapshot (docs/sharding.md, "Capacity and projection"): one
// field per session in the hash <Key>:ended, its expiry in the sorted set
// <Key>:ended:exp. Every write is fenced like Save and drops the records
// whose expiry passed; both keys expire with their last record.

// Record is one ended session's stored state.
type Record struct {
	ID     string
	Data   []byte
	Expire time.Time // when the record is forgotten (the session's retention)
}

// Write is one fenced update: ended sessions' records to put and to
// delete, and the snapshot (optional).
type Write struct {
	// Snapshot, when not nil, is stored as the write's generation.
	Snapshot []byte
	Put      []Record
	Delete   []string
	// Claim makes the write conditional on the stored generation being
	// From (-1: none stored), the one the writer restored: a new owner's
	// first save. Another owner's save landing between the load and the
	// claim (a previous owner that does not know yet) fails it with
	// ErrChanged: the writer restores again, and nothing that owner saved
	// (and acknowledged) is lost.
	Claim bool
	From  int64
}

// ErrChanged means a claim found another generation stored than the one
// restored: load again.
var ErrChanged = errors.New("checkpoint: another owner saved since the checkpoint was loaded; load it again")

// ChunkBytes bounds the record bytes sent in one script call: a backlog
// (e.g. every ended session of a checkpoint an older version wrote) goes
// in several calls, each fenced.
const ChunkBytes = 1 << 20

const chunkRecords = 1000

// write checks the fence (the stored generation must be older than
// ARGV[1]), applies the records (KEYS[2] hash, KEYS[3] expiries), drops
// expired ones, and stores the snapshot when ARGV[2] is '1'.
//
// ARGV: gen, '1'|'0', snapshot, now (ms), writer, expected generation
// (empty for none; else 2 when another is stored), #puts, then id, value,
// expiry (ms) per put, then the ids to delete.
//
// The writer's own generation already stored is its own to write again:
// a write whose reply was lost (a timeout while Redis was paused, which
// the client may send again; or a failed save the writer repeats at the
// same generation, with newer data) landed, and no other owner claimed
// since — a claim would have stored a higher generation, or this one
// under another writer.
var write = redis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], 'gen') or '-1')
local mine = cur == tonumber(ARGV[1]) and redis.call('HGET', KEYS[1], 'writer') == ARGV[5]
if not mine then
  if cur >= tonumber(ARGV[1]) then return 0 end
  if ARGV[6] ~= '' and cur ~= tonumber(ARGV[6]) then return 2 end
end
local nput = tonumber(ARGV[7])
local i = 8
for _ = 1, nput do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i+1])
  redis.call('ZADD', KEYS[3], ARGV[i+2], ARGV[i])
  i = i + 3
end
while i <= #ARGV do
  redis.call('HDEL', KEYS[2], ARGV[i])
  redis.call('ZREM', KEYS[3], ARGV[i])
  i = i + 1
end
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[4], 'LIMIT', 0, 1000)
if #old > 0 then
  redis.call('HDEL', KEYS[2], unpack(old))
  redis.call('ZREM', KEYS[3], unpack(old))
end
if nput > 0 then
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if #last == 2 then
    redis.call('PEXPIREAT', KEYS[2], last[2])
    redis.call('PEXPIREAT', KEYS[3], last[2])
  end
end
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'data', ARGV[3], 'writer', ARGV[5])
end
return 1
`)

// check refuses (0) when the stored generation is not older than ARGV[1],
// unless it is ARGV[1] stored by this writer (ARGV[2]): its own write
// whose reply was lost.
var check = redis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], 'gen') or '-1')
if cur == tonumber(ARGV[1]) and redis.call('HGET', KEYS[1], 'writer') == ARGV[2] then return 1 end
if cur >= tonumber(ARGV[1]) then return 0 end
return 1
`)

func (s *Store) endedKey() string    { return s.Key + ":ended" }
func (s *Store) endedExpKey() string { return s.Key + ":ended:exp" }

// Write applies w as generation gen, refused with ErrStale when a
// generation at or above gen was saved (another owner). The records go
// first, in chunks of at most ChunkBytes, each fenced; the snapshot goes
// with the last chunk. now drops the records that expired.
func (s *Store) Write(ctx context.Context, gen int64, w Write, now time.Time) error {
	keys := []string{s.Key, s.endedKey(), s.endedExpKey()}
	put, del := w.Put, w.Delete
	for {
		expect := ""
		if w.Claim {
			expect = strconv.FormatInt(w.From, 10)
		}
		args := []any{gen, "0", "", now.UnixMilli(), s.writer(), expect, 0}
		n, size := 0, 0
		for n < len(put) && n < chunkRecords && (n == 0 || size+len(put[n].Data) <= ChunkBytes) {
			r := put[n]
			args = append(args, r.ID, r.Data, r.Expire.UnixMilli())
			size += len(r.Data)
			n++
		}
		args[6] = n
		put = put[n:]
		last := len(put) == 0
		if last {
			m := min(len(del), chunkRecords)
			for _, id := range del[:m] {
				args = append(args, id)
			}
			del = del[m:]
			last = len(del) == 0
		}
		if last && w.Snapshot != nil {
			args[1], args[2] = "1", w.Snapshot
		}
		ok, err := write.Run(ctx, s.Client, keys, args...).Int()
		if err != nil {
			return fmt.Errorf("checkpoint: write: %w", err)
		}
		switch ok {
		case 0:
			return ErrStale
		case 2:
			return ErrChanged
		}
		if last {
			return nil
		}
	}
}

// Check returns ErrStale when a generation at or above gen was saved by
// another writer: a writer with nothing to save learns that it lost the
// checkpoint.
func (s *Store) Check(ctx context.Context, gen int64) error {
	ok, err := check.Run(ctx, s.Client, []string{s.Key}, gen, s.writer()).Int()
	if err != nil {
		return fmt.Errorf("checkpoint: check: %w", err)
	}
	if ok == 0 {
		return ErrStale
	}
	return nil
}

// LoadEnded returns the ended sessions' records not expired at now.
func (s *Store) LoadEnded(ctx context.Context, now time.Time) ([]Record, error) {
	zs, err := s.Client.ZRangeByScoreWithScores(ctx, s.endedExpKey(),
		&redis.ZRangeBy{Min: strconv.FormatInt(now.UnixMilli(), 10), Max: "+inf"}).Result()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load ended sessions: %w", err)
	}
	out := make([]Record, 0, len(zs))
	for len(zs) > 0 {
		n := min(len(zs), chunkRecords)
		ids := make([]string, n)
		for i, z := range zs[:n] {
			ids[i], _ = z.Member.(string)
		}
		vals, err := s.Client.HMGet(ctx, s.endedKey(), ids...).Result()
		if err != nil {
			return nil, fmt.Errorf("checkpoint: load ended sessions: %w", err)
		}
		for i, v := range vals {
			if d, ok := v.(string); ok {
				out = append(out, Record{ID: ids[i], Data: []byte(d), Expire: time.UnixMilli(int64(zs[i].Score))})
			}
		}
		zs = zs[n:]
	}
	return out, nil
}
