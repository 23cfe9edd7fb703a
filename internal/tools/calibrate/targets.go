package calibrate

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// target is a store the benchmark drives. Worker i of a measurement uses
// its own connection where the store has them (a pod pull client, a
// producer).
type target interface {
	name() string
	put(ctx context.Context, worker int, key string, data []byte) error
	// get reads key into buf (which is at least the object's size) and
	// returns the bytes read.
	get(ctx context.Context, worker int, key string, buf []byte) (int, error)
	del(ctx context.Context, keys []string) error
	// warm opens worker's connection (untimed, before a measurement).
	warm(ctx context.Context, worker int) error
}

// redisTarget is one Redis shard through go-redis.
type redisTarget struct{ c *redis.Client }

func (redisTarget) name() string { return Redis }
func (r redisTarget) put(ctx context.Context, _ int, key string, data []byte) error {
	return r.c.Set(ctx, key, data, time.Hour).Err()
}
func (r redisTarget) get(ctx context.Context, _ int, key string, _ []byte) (int, error) {
	b, err := r.c.Get(ctx, key).Bytes()
	return len(b), err
}
func (r redisTarget) del(ctx context.Context, keys []string) error {
	for len(keys) > 0 {
		n := min(len(keys), 500)
		if err := r.c.Del(ctx, keys[:n]...).Err(); err != nil {
			return err
		}
		keys = keys[n:]
	}
	return nil
}
func (r redisTarget) warm(ctx context.Context, _ int) error { return r.c.Ping(ctx).Err() }

// s3Target is one bucket of an S3 store through minio-go: one PUT per
// object (no multipart upload, as Locus's requests), GETs read into the
// worker's buffer.
type s3Target struct {
	c      *minio.Client
	bucket string
}

func (s3Target) name() string { return S3 }
func (s s3Target) put(ctx context.Context, _ int, key string, data []byte) error {
	_, err := s.c.PutObject(ctx, s.bucket, key, bytes.NewReader(data), int64(len(data)),
		minio.PutObjectOptions{DisableMultipart: true, ContentType: "application/octet-stream"})
	return err
}
func (s s3Target) get(ctx context.Context, _ int, key string, buf []byte) (int, error) {
	o, err := s.c.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return 0, err
	}
	defer o.Close()
	n, err := io.ReadFull(o, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil // the object is smaller than the buffer
	}
	if err == nil {
		// the object must end here: a larger object would not fit
		var one [1]byte
		if m, _ := o.Read(one[:]); m > 0 {
			return n, fmt.Errorf("s3 object %s larger than %d bytes", key, len(buf))
		}
	}
	return n, err
}
func (s s3Target) del(ctx context.Context, keys []string) error {
	var errs []error
	for _, k := range keys {
		if err := s.c.RemoveObject(ctx, s.bucket, k, minio.RemoveObjectOptions{}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
func (s s3Target) warm(ctx context.Context, _ int) error {
	_, err := s.c.BucketExists(ctx, s.bucket)
	return err
}

// podTarget is ziptrail's pod-memory data plane in this process, as
// bench/dataplane runs it: producers are pull.Servers on loopback TCP, each
// with its own object store; consumer i pulls with its own pull.Client
// (its own pull-stream connections) from producer i. Objects allow
// unlimited reads, so one object serves a whole measurement.
type podTarget struct {
	keys    *ref.Keyring
	prods   []*pull.Server
	addrs   []string
	clients []*pull.Client
	mu      sync.Mutex
	refs    map[string]podRef
}

type podRef struct {
	prod int
	ref  string
}

// newPodTarget starts n producers (each holding up to capBytes) and n
// consumers.
func newPodTarget(n int, capBytes int64) (*podTarget, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	k, err := ref.NewKeyring("calibrate", map[string][]byte{"k1": secret}, "k1")
	if err != nil {
		return nil, err
	}
	t := &podTarget{keys: k, refs: map[string]podRef{}}
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.close()
			return nil, err
		}
		s := &pull.Server{Store: store.New(capBytes, nil), Keys: k}
		go func() { _ = s.Serve(ln) }()
		t.prods = append(t.prods, s)
		t.addrs = append(t.addrs, ln.Addr().String())
		t.clients = append(t.clients, &pull.Client{Keys: k})
	}
	return t, nil
}

func (t *podTarget) close() {
	for _, s := range t.prods {
		_ = s.Close()
	}
	for _, c := range t.clients {
		c.Close()
	}
}

func (*podTarget) name() string { return Pod }

func (t *podTarget) put(ctx context.Context, worker int, key string, data []byte) error {
	i := worker % len(t.prods)
	exp := time.Now().Add(time.Hour)
	if err := t.prods[i].Store.Put(ctx, store.Meta{ID: key, Bucket: "calibrate", Key: key, Reads: math.MaxUint32, Expires: exp}, data); err != nil {
		return err
	}
	r, err := t.keys.Seal(ref.Record{Addr: t.addrs[i], Key: key, Expires: exp, Reads: math.MaxUint32})
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.refs[key] = podRef{i, r}
	t.mu.Unlock()
	return nil
}

func (t *podTarget) get(ctx context.Context, worker int, key string, buf []byte) (int, error) {
	t.mu.Lock()
	r, ok := t.refs[key]
	t.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("pod object %s not stored", key)
	}
	info, err := t.clients[worker%len(t.clients)].PullTo(ctx, r.ref, func(size int64) (io.WriterAt, error) {
		if size > int64(len(buf)) {
			return nil, fmt.Errorf("pod object %s: %d bytes, buffer %d", key, size, len(buf))
		}
		return sliceWriter(buf[:size]), nil
	})
	return int(info.Size), err
}

func (t *podTarget) del(_ context.Context, keys []string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		if r, ok := t.refs[k]; ok {
			t.prods[r.prod].Store.Remove(k)
			delete(t.refs, k)
		}
	}
	return nil
}

// warm opens consumer worker's connection to its producer with a pull of a
// one-byte object.
func (t *podTarget) warm(ctx context.Context, worker int) error {
	key := fmt.Sprintf("warm-%d", worker)
	t.mu.Lock()
	_, ok := t.refs[key]
	t.mu.Unlock()
	if !ok {
		if err := t.put(ctx, worker, key, []byte{1}); err != nil {
			return err
		}
	}
	var b [1]byte
	_, err := t.get(ctx, worker, key, b[:])
	return err
}

type sliceWriter []byte

func (s sliceWriter) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(s)) {
		return 0, io.ErrShortWrite
	}
	return copy(s[off:], p), nil
}
