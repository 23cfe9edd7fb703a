package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/ziptrail/ziptrail/bench/internal/parallel"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

type system struct {
	name     string
	oneToOne func(ctx context.Context, data []byte) error
	// prepared, instead of oneToOne: untimed preparation, then the timed part.
	prepared func(ctx context.Context, data []byte) (func() error, error)
	pattern  func(ctx context.Context, pattern string, fan int, data []byte) func() error
}

type env struct {
	tb      *servers.ProcessTB
	redis   *servers.Redis
	s3      *servers.MinIO
	bucket  string
	keys    *ref.Keyring
	prods   []*producer
	raw     net.Conn
	rawLn   net.Listener
	seq     atomic.Int64
	withS3  bool
	clients []*pull.Client
	// The SDK path: two pods' local APIs.
	sdkA, sdkB *sdkPod
	// The in-place SDK system's own pods: the systems take turns, and
	// sharing a client would hand one system's reused put file to the
	// other.
	placeA, placeB *sdkPod
}

type producer struct {
	srv  *pull.Server
	addr string
}

const fanMax = 16

func setup(withS3 bool) (*env, error) {
	e := &env{tb: &servers.ProcessTB{ExitOnFatal: true}, withS3: withS3}
	e.redis = servers.StartRedis(e.tb)
	if withS3 {
		e.s3 = servers.StartMinIO(e.tb)
		e.bucket = e.s3.Bucket(e.tb, "bench")
	}
	k, err := ref.NewKeyring("bench", map[string][]byte{"k1": bytes.Repeat([]byte{9}, 32)}, "k1")
	if err != nil {
		return nil, err
	}
	e.keys = k
	// Producer sidecars (one per gather source) and consumer clients.
	for i := 0; i < fanMax; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		s := &pull.Server{Store: store.New(8<<30, nil), Keys: k}
		go s.Serve(ln)
		e.prods = append(e.prods, &producer{srv: s, addr: ln.Addr().String()})
		e.clients = append(e.clients, &pull.Client{Keys: k})
	}
	if e.sdkA, err = startSDKPod(k); err != nil {
		return nil, err
	}
	if e.sdkB, err = startSDKPod(k); err != nil {
		return nil, err
	}
	if e.placeA, err = startSDKPod(k); err != nil {
		return nil, err
	}
	if e.placeB, err = startSDKPod(k); err != nil {
		return nil, err
	}
	// Raw TCP: a server that answers a size with that many bytes.
	e.rawLn, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	src := payload(100_000_000)
	go func() {
		for {
			c, err := e.rawLn.Accept()
			if err != nil {
				return
			}
			go func() {
				var hdr [8]byte
				for {
					if _, err := io.ReadFull(c, hdr[:]); err != nil {
						return
					}
					if _, err := c.Write(src[:binary.BigEndian.Uint64(hdr[:])]); err != nil {
						return
					}
				}
			}()
		}
	}()
	e.raw, err = net.Dial("tcp", e.rawLn.Addr().String())
	return e, err
}

func (e *env) close() {
	e.raw.Close()
	e.rawLn.Close()
	for _, p := range e.prods {
		p.srv.Close()
	}
	for _, c := range e.clients {
		c.Close()
	}
	for _, p := range []*sdkPod{e.sdkA, e.sdkB, e.placeA, e.placeB} {
		if p != nil {
			p.close()
		}
	}
	e.tb.Close()
}

func (e *env) names() []string {
	n := []string{"raw TCP", "ziptrail", "ziptrail SDK", sdkInPlace, sdkFloor, "Redis"}
	if e.withS3 {
		n = append(n, "S3")
	}
	return n
}

func (e *env) systems() []system {
	s := []system{
		{name: "raw TCP", oneToOne: e.rawOne},
		{name: "ziptrail", oneToOne: e.ztOne, pattern: e.ztPattern},
		{name: "ziptrail SDK", oneToOne: e.sdkOne},
		{name: sdkInPlace, prepared: e.sdkInPlace},
		{name: sdkFloor, oneToOne: e.sdkFloor},
		{name: "Redis", oneToOne: e.redisOne, pattern: e.redisPattern},
	}
	if e.withS3 {
		s = append(s, system{name: "S3", oneToOne: e.s3One, pattern: e.s3Pattern})
	}
	return s
}

func (e *env) id() string { return fmt.Sprintf("o%d", e.seq.Add(1)) }

func (e *env) rawOne(_ context.Context, data []byte) error {
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], uint64(len(data)))
	if _, err := e.raw.Write(hdr[:]); err != nil {
		return err
	}
	buf := make([]byte, len(data))
	_, err := io.ReadFull(e.raw, buf)
	return err
}

// ztPut is the producer's put: the object stays in its memory; a sealed
// reference is what travels.
func (e *env) ztPut(ctx context.Context, p *producer, data []byte, reads uint32) (string, error) {
	id := e.id()
	exp := time.Now().Add(time.Minute)
	if err := p.srv.Store.Put(ctx, store.Meta{ID: id, Bucket: "b", Key: id, Reads: reads, Expires: exp}, data); err != nil {
		return "", err
	}
	return e.keys.Seal(ref.Record{Addr: p.addr, Key: id, Expires: exp, Reads: reads})
}

func (e *env) ztOne(ctx context.Context, data []byte) error {
	r, err := e.ztPut(ctx, e.prods[0], data, 1)
	if err != nil {
		return err
	}
	got, _, err := e.clients[0].Pull(ctx, r)
	if err == nil && len(got) != len(data) {
		err = fmt.Errorf("pulled %d bytes of %d", len(got), len(data))
	}
	return err
}

func (e *env) ztPattern(ctx context.Context, pattern string, fan int, data []byte) func() error {
	return func() error {
		switch pattern {
		case "scatter": // one producer, fan consumers, an object each
			refs := make([]string, fan)
			for i := range refs {
				var err error
				if refs[i], err = e.ztPut(ctx, e.prods[0], data, 1); err != nil {
					return err
				}
			}
			return parallel.Do(fan, func(i int) error { _, _, err := e.clients[i].Pull(ctx, refs[i]); return err })
		case "gather": // fan producers, one consumer
			refs := make([]string, fan)
			if err := parallel.Do(fan, func(i int) error {
				var err error
				refs[i], err = e.ztPut(ctx, e.prods[i], data, 1)
				return err
			}); err != nil {
				return err
			}
			return parallel.Do(fan, func(i int) error { _, _, err := e.clients[0].Pull(ctx, refs[i]); return err })
		default: // broadcast: one object, fan consumers
			r, err := e.ztPut(ctx, e.prods[0], data, uint32(fan))
			if err != nil {
				return err
			}
			return parallel.Do(fan, func(i int) error { _, _, err := e.clients[i].Pull(ctx, r); return err })
		}
	}
}

func (e *env) redisOne(ctx context.Context, data []byte) error {
	k := e.id()
	if err := e.redis.Client.Set(ctx, k, data, time.Minute).Err(); err != nil {
		return err
	}
	got, err := e.redis.Client.Get(ctx, k).Bytes()
	if err == nil && len(got) != len(data) {
		err = fmt.Errorf("got %d bytes", len(got))
	}
	e.redis.Client.Del(ctx, k)
	return err
}

func (e *env) redisPattern(ctx context.Context, pattern string, fan int, data []byte) func() error {
	c := e.redis.Client
	return func() error {
		keys := make([]string, fan)
		for i := range keys {
			keys[i] = e.id()
		}
		defer c.Del(ctx, keys...)
		switch pattern {
		case "scatter":
			for _, k := range keys {
				if err := c.Set(ctx, k, data, time.Minute).Err(); err != nil {
					return err
				}
			}
			return parallel.Do(fan, func(i int) error { return c.Get(ctx, keys[i]).Err() })
		case "gather":
			if err := parallel.Do(fan, func(i int) error { return c.Set(ctx, keys[i], data, time.Minute).Err() }); err != nil {
				return err
			}
			return parallel.Do(fan, func(i int) error { return c.Get(ctx, keys[i]).Err() })
		default:
			if err := c.Set(ctx, keys[0], data, time.Minute).Err(); err != nil {
				return err
			}
			return parallel.Do(fan, func(int) error { return c.Get(ctx, keys[0]).Err() })
		}
	}
}

func (e *env) s3Put(ctx context.Context, k string, data []byte) error {
	_, err := e.s3.Client.PutObject(ctx, e.bucket, k, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{})
	return err
}

func (e *env) s3Get(ctx context.Context, k string) error {
	o, err := e.s3.Client.GetObject(ctx, e.bucket, k, minio.GetObjectOptions{})
	if err != nil {
		return err
	}
	defer o.Close()
	_, err = io.Copy(io.Discard, o)
	return err
}

func (e *env) s3One(ctx context.Context, data []byte) error {
	k := e.id()
	if err := e.s3Put(ctx, k, data); err != nil {
		return err
	}
	defer e.s3.Client.RemoveObject(ctx, e.bucket, k, minio.RemoveObjectOptions{})
	return e.s3Get(ctx, k)
}

func (e *env) s3Pattern(ctx context.Context, pattern string, fan int, data []byte) func() error {
	return func() error {
		keys := make([]string, fan)
		for i := range keys {
			keys[i] = e.id()
		}
		defer func() {
			for _, k := range keys {
				_ = e.s3.Client.RemoveObject(ctx, e.bucket, k, minio.RemoveObjectOptions{})
			}
		}()
		switch pattern {
		case "scatter":
			for _, k := range keys {
				if err := e.s3Put(ctx, k, data); err != nil {
					return err
				}
			}
			return parallel.Do(fan, func(i int) error { return e.s3Get(ctx, keys[i]) })
		case "gather":
			if err := parallel.Do(fan, func(i int) error { return e.s3Put(ctx, keys[i], data) }); err != nil {
				return err
			}
			return parallel.Do(fan, func(i int) error { return e.s3Get(ctx, keys[i]) })
		default:
			if err := e.s3Put(ctx, keys[0], data); err != nil {
				return err
			}
			return parallel.Do(fan, func(int) error { return e.s3Get(ctx, keys[0]) })
		}
	}
}
