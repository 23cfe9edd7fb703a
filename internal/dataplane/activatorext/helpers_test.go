package activatorext

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

const testNS = "team-a"

// producer is a real data-plane producer (pull.Server, Cap'n Proto) on
// loopback with its own store and the namespace's keyring.
type producer struct {
	srv   *pull.Server
	addr  string
	keys  map[string][]byte
	ring  *ref.Keyring
	store *store.Store
}

func startProducer(t testing.TB) *producer {
	t.Helper()
	keys := map[string][]byte{"k1": bytes.Repeat([]byte{7}, 32)}
	kr, err := ref.NewKeyring(testNS, keys, "k1")
	if err != nil {
		t.Fatal(err)
	}
	p := &producer{keys: keys, ring: kr, store: store.New(64<<20, nil)}
	p.srv = &pull.Server{Store: p.store, Keys: kr}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() { _ = p.srv.Close() })
	return p
}

// put stores an object that expires at exp and returns its reference
// (valid for an hour: the object's TTL is what keep-alive extends).
func (p *producer) put(t testing.TB, id string, exp time.Time) string {
	t.Helper()
	if err := p.store.Put(context.Background(), store.Meta{ID: id, Bucket: "b", Key: id, Expires: exp}, []byte("payload-"+id)); err != nil {
		t.Fatal(err)
	}
	r, err := p.ring.Seal(ref.Record{Addr: p.addr, Key: id, Expires: time.Now().Add(time.Hour), Reads: 1})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (p *producer) expires(t *testing.T, id string) time.Time {
	t.Helper()
	_, m, ok := p.store.Peek(id)
	if !ok {
		t.Fatalf("object %s is gone from the producer", id)
	}
	return m.Expires
}

// secrets serves a namespace's keys as the operator's GetKeys does; it
// counts reads.
type secrets struct {
	mu    sync.Mutex
	data  map[string]map[string][]byte // namespace -> keys by id
	act   map[string]string            // namespace -> active key id
	reads int
}

func (s *secrets) set(ns string, keys map[string][]byte, active string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.data == nil {
		s.data, s.act = map[string]map[string][]byte{}, map[string]string{}
	}
	d := map[string][]byte{}
	for id, k := range keys {
		d[id] = k
	}
	s.data[ns], s.act[ns] = d, active
}

func (s *secrets) get(_ context.Context, ns string) (map[string][]byte, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	d, ok := s.data[ns]
	if !ok {
		return nil, "", status.Errorf(codes.NotFound, "no keys in namespace %s", ns)
	}
	out := map[string][]byte{}
	for id, k := range d {
		out[id] = k
	}
	return out, s.act[ns], nil
}

// clock is a hand-driven clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// ticker is a hand-driven ticker.
type ticker struct {
	c       chan time.Time
	mu      sync.Mutex
	stopped bool
	period  time.Duration
}

func newTicker() *ticker { return &ticker{c: make(chan time.Time)} }

func (k *ticker) Tick(d time.Duration) (<-chan time.Time, func()) {
	k.mu.Lock()
	k.period = d
	k.mu.Unlock()
	return k.c, func() { k.mu.Lock(); k.stopped = true; k.mu.Unlock() }
}

func (k *ticker) isStopped() bool { k.mu.Lock(); defer k.mu.Unlock(); return k.stopped }

// metrics returns Metrics on a manual reader and a function that sums a
// counter by attribute value.
func testMetrics(t testing.TB) (*Metrics, func(name, attr, value string) int64) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	m, err := NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	return m, func(name, attr, value string) int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, sm := range rm.ScopeMetrics {
			for _, md := range sm.Metrics {
				if md.Name != name {
					continue
				}
				switch d := md.Data.(type) {
				case metricdata.Sum[int64]:
					for _, p := range d.DataPoints {
						if v, ok := p.Attributes.Value(attribute.Key(attr)); attr == "" || (ok && v.AsString() == value) {
							n += p.Value
						}
					}
				case metricdata.Histogram[float64]:
					for _, p := range d.DataPoints {
						n += int64(p.Count)
					}
				}
			}
		}
		return n
	}
}
