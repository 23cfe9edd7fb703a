package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisBench runs the Redis side: every function has its own connection
// to one redis-server (as functions without direct messaging would share
// a Redis), and a message is an LPUSH by the sender onto a list the
// receiver BRPOPs.
type redisBench struct {
	addr    string
	clients []*redis.Client
	seq     atomic.Int64
}

func newRedisBench(addr string) *redisBench { return &redisBench{addr: addr} }

// client is a new connection for one function.
func (rb *redisBench) client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: rb.addr, PoolSize: 1, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	rb.clients = append(rb.clients, c)
	return c
}

func (rb *redisBench) close() {
	for _, c := range rb.clients {
		c.Close()
	}
}

func (rb *redisBench) key(prefix string) string { return fmt.Sprintf("%s:%d", prefix, rb.seq.Add(1)) }

// brpop blocks for the next value of key (no fixed timeout: the bench's
// context bounds it).
func brpop(ctx context.Context, c *redis.Client, key string) (string, error) {
	v, err := c.BRPop(ctx, time.Minute, key).Result()
	if err != nil {
		return "", err
	}
	return v[1], nil
}

// pingPong: function A LPUSHes onto B's list and BRPOPs its own; B BRPOPs
// and LPUSHes what it got back (reading every page of it, as on the
// ziptrail side). Two connections, one per function.
func (rb *redisBench) pingPong(ctx context.Context, data []byte, n int) ([]float64, error) {
	a, b := rb.client(), rb.client()
	toB, toA := rb.key("pp:b"), rb.key("pp:a")
	if err := a.Ping(ctx).Err(); err != nil {
		return nil, err
	}
	if err := b.Ping(ctx).Err(); err != nil {
		return nil, err
	}
	total := n + warmups
	echoed := make(chan error, 1)
	go func() {
		echoed <- func() error {
			for range total {
				v, err := brpop(ctx, b, toB)
				if err != nil {
					return err
				}
				touchString(v)
				if err := b.LPush(ctx, toA, v).Err(); err != nil {
					return err
				}
			}
			return nil
		}()
	}()
	rtts := make([]float64, 0, n)
	for i := range total {
		t := time.Now()
		if err := a.LPush(ctx, toB, data).Err(); err != nil {
			return nil, err
		}
		v, err := brpop(ctx, a, toA)
		if err != nil {
			return nil, err
		}
		touchString(v)
		rtt := time.Since(t).Seconds()
		if i == 0 && v != string(data) {
			return nil, fmt.Errorf("the echo differs (%d bytes, sent %d)", len(v), len(data))
		}
		if len(v) != len(data) {
			return nil, fmt.Errorf("the echo has %d bytes, sent %d", len(v), len(data))
		}
		if i >= warmups {
			rtts = append(rtts, rtt)
		}
	}
	return rtts, <-echoed
}

func touchString(s string) (x byte) {
	for i := 0; i < len(s); i += 4096 {
		x += s[i]
	}
	return x
}

// stream returns the Fig. 8 measurement: count LPUSHes of 64 B, one
// command each or all in one pipeline (Redis's best case), while the
// receiver BRPOPs them one by one; timed until it has the last.
func (rb *redisBench) stream(pipelined bool) func(ctx context.Context, count, n int) ([]float64, error) {
	return func(ctx context.Context, count, n int) ([]float64, error) {
		a, b := rb.client(), rb.client()
		msg := payload(64)
		var ts []float64
		for i := range n + 1 {
			key := rb.key("stream")
			got := make(chan error, 1)
			go func() {
				got <- func() error {
					for j := range count {
						v, err := brpop(ctx, b, key)
						if err != nil {
							return err
						}
						if len(v) != 64 {
							return fmt.Errorf("message %d has %d bytes", j, len(v))
						}
					}
					return nil
				}()
			}()
			t := time.Now()
			if pipelined {
				p := a.Pipeline()
				for range count {
					p.LPush(ctx, key, msg)
				}
				if _, err := p.Exec(ctx); err != nil {
					return nil, err
				}
			} else {
				for range count {
					if err := a.LPush(ctx, key, msg).Err(); err != nil {
						return nil, err
					}
				}
			}
			if err := <-got; err != nil {
				return nil, err
			}
			if i > 0 || n == 0 { // the first is a warm-up, unless only one is asked for
				ts = append(ts, time.Since(t).Seconds())
			}
		}
		return ts, nil
	}
}

func encodeF64(v []float64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
	}
	return b
}

func decodeF64(s string) []float64 {
	v := make([]float64, len(s)/8)
	for i := range v {
		o := 8 * i
		v[i] = math.Float64frombits(uint64(s[o]) | uint64(s[o+1])<<8 | uint64(s[o+2])<<16 | uint64(s[o+3])<<24 |
			uint64(s[o+4])<<32 | uint64(s[o+5])<<40 | uint64(s[o+6])<<48 | uint64(s[o+7])<<56)
	}
	return v
}

// allreduce through Redis, the straightforward way: every member but
// rank 0 LPUSHes its encoded vector onto rank 0's list; rank 0 BRPOPs
// members-1 vectors, adds them to its own, and LPUSHes the result onto
// every other member's list, from which each BRPOPs it. One connection
// per member.
func (rb *redisBench) allreduce(ctx context.Context, members, n int) ([]float64, error) {
	cs := make([]*redis.Client, members)
	for r := range cs {
		cs[r] = rb.client()
		if err := cs[r].Ping(ctx).Err(); err != nil {
			return nil, err
		}
	}
	elems := allreduceBytes / 8
	in := make([][]float64, members)
	for r := range in {
		in[r] = vector(r, elems)
	}
	outs := make([][]float64, members)
	var ts []float64
	for i := range n + 1 {
		base := rb.key("allreduce")
		list := func(r int) string { return fmt.Sprintf("%s:%d", base, r) }
		t, err := timeMembers(members, func(r int) error {
			c := cs[r]
			if r != 0 {
				if err := c.LPush(ctx, list(0), encodeF64(in[r])).Err(); err != nil {
					return err
				}
				v, err := brpop(ctx, c, list(r))
				if err != nil {
					return err
				}
				outs[r] = decodeF64(v)
				return nil
			}
			acc := append([]float64{}, in[0]...)
			for range members - 1 {
				v, err := brpop(ctx, c, list(0))
				if err != nil {
					return err
				}
				for j, x := range decodeF64(v) {
					acc[j] += x
				}
			}
			res := encodeF64(acc)
			for o := 1; o < members; o++ {
				if err := c.LPush(ctx, list(o), res).Err(); err != nil {
					return err
				}
			}
			outs[0] = acc
			return nil
		})
		if err != nil {
			return nil, err
		}
		for r := range outs {
			if err := checkSum(outs[r], members, elems); err != nil {
				return nil, fmt.Errorf("rank %d: %w", r, err)
			}
		}
		if i > 0 {
			ts = append(ts, t)
		}
	}
	return ts, nil
}

// pingRoundTrip times PING: one round trip to redis-server.
func (rb *redisBench) pingRoundTrip(ctx context.Context, n int) ([]float64, error) {
	c := rb.client()
	ts := make([]float64, 0, n)
	for i := range n + warmups {
		t := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			return nil, err
		}
		if i >= warmups {
			ts = append(ts, time.Since(t).Seconds())
		}
	}
	return ts, nil
}

// lpushOnly times one LPUSH of 64 B (returns once Redis holds it).
func (rb *redisBench) lpushOnly(ctx context.Context, n int) ([]float64, error) {
	c := rb.client()
	key := rb.key("lpush")
	msg := payload(64)
	ts := make([]float64, 0, n)
	for i := range n + warmups {
		t := time.Now()
		if err := c.LPush(ctx, key, msg).Err(); err != nil {
			return nil, err
		}
		if i >= warmups {
			ts = append(ts, time.Since(t).Seconds())
		}
	}
	return ts, c.Del(ctx, key).Err()
}
