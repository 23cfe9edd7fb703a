package messaging

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisMailbox keeps messages for ranks not running in the fast tier: one
// Redis list per namespace, session, group and rank, in send order.
type RedisMailbox struct {
	Client    *redis.Client
	Namespace string
	// TTL bounds how long a mailbox is kept after its last message
	// (default 10 minutes).
	TTL time.Duration
}

func (b *RedisMailbox) key(session, group string, rank uint32) string {
	return fmt.Sprintf("zt:mbox:%s:%d:%s:%d:%s:%d", b.Namespace, len(session), session, len(group), group, rank)
}

// header: from, tag, seq, size, reserved; then the bytes.
const headerLen = 4 + 8 + 8 + 8 + 4

func encode(m Message) []byte {
	out := make([]byte, headerLen, headerLen+len(m.Data))
	binary.BigEndian.PutUint32(out[0:], m.From)
	binary.BigEndian.PutUint64(out[4:], uint64(m.Tag))
	binary.BigEndian.PutUint64(out[12:], m.Seq)
	binary.BigEndian.PutUint64(out[20:], m.Size)
	binary.BigEndian.PutUint32(out[28:], 0) // reserved
	return append(out, m.Data...)
}

var errCorrupt = errors.New("mailbox: corrupt message")

func decode(b []byte) (Message, error) {
	if len(b) < headerLen {
		return Message{}, errCorrupt
	}
	m := Message{From: binary.BigEndian.Uint32(b[0:]), Tag: int64(binary.BigEndian.Uint64(b[4:])),
		Seq: binary.BigEndian.Uint64(b[12:]), Size: binary.BigEndian.Uint64(b[20:])}
	if binary.BigEndian.Uint32(b[28:]) != 0 || uint64(len(b)-headerLen) != m.Size {
		return Message{}, errCorrupt
	}
	m.Data = b[headerLen:]
	return m, nil
}

func (b *RedisMailbox) ttl() time.Duration {
	if b.TTL > 0 {
		return b.TTL
	}
	return 10 * time.Minute
}

// Push appends a message to the rank's mailbox.
func (b *RedisMailbox) Push(ctx context.Context, session, group string, rank uint32, m Message) error {
	k := b.key(session, group, rank)
	p := b.Client.TxPipeline()
	p.RPush(ctx, k, encode(m))
	p.Expire(ctx, k, b.ttl())
	_, err := p.Exec(ctx)
	return err
}

// Take removes and returns the rank's messages.
func (b *RedisMailbox) Take(ctx context.Context, session, group string, rank uint32) ([]Message, error) {
	k := b.key(session, group, rank)
	p := b.Client.TxPipeline()
	r := p.LRange(ctx, k, 0, -1)
	p.Del(ctx, k)
	if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var out []Message
	for _, s := range r.Val() {
		m, err := decode([]byte(s))
		if err != nil {
			continue // not ours: nothing else writes these keys
		}
		m.Session, m.Group, m.To = session, group, rank
		out = append(out, m)
	}
	return out, nil
}
