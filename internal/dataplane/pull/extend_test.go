package pull

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// rawExtend is an attacker's extend: straight to the producer's data-plane
// port with its own connection, no pull.Client in between.
func rawExtend(t *testing.T, addr, r string, untilMs int64) (bool, error) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	q := request{op: opExtend, until: untilMs, ref: r}
	if _, err := nc.Write(append(StreamMagic[:], q.encode()...)); err != nil {
		t.Fatal(err)
	}
	p, err := readResponse(bufio.NewReader(nc))
	if err != nil {
		t.Fatal(err)
	}
	if p.code != codeOK {
		return false, fmt.Errorf("%w: %s", codeErrors[p.code], p.msg)
	}
	return p.ok, nil
}

// TestExtendBeyondTheLimitIsRefused: a holder of a valid reference asks the
// producer to keep the object for centuries. The producer refuses with an
// error naming its limit and the object keeps its expiry; an extension
// within the limit still works.
func TestExtendBeyondTheLimitIsRefused(t *testing.T) {
	s, refs := startProducer(t, map[string][]byte{"other": nil}, 1)
	seed, err := s.Keys.Open(refs["other"], time.Now())
	if err != nil {
		t.Fatal(err)
	}
	addr := seed.Addr
	exp := time.Now().Add(time.Minute)
	if err := s.Store.Put(context.Background(), store.Meta{ID: "o", Key: "o", Reads: 1, Expires: exp}, []byte("held in pod memory")); err != nil {
		t.Fatal(err)
	}
	r, err := s.Keys.Seal(ref.Record{Addr: addr, Key: "o", Expires: exp, Reads: 1})
	if err != nil {
		t.Fatal(err)
	}
	for name, until := range map[string]int64{
		"a hundred years":  time.Now().AddDate(100, 0, 0).UnixMilli(),
		"max int64":        math.MaxInt64,
		"limit plus 1 min": time.Now().Add(DefaultMaxExtend + time.Minute).UnixMilli(),
	} {
		ok, err := rawExtend(t, addr, r, until)
		if err == nil {
			t.Errorf("%s: extend answered ok=%v, want an error naming the limit", name, ok)
		} else if !strings.Contains(err.Error(), ErrExtendTooFar.Error()) || !strings.Contains(err.Error(), DefaultMaxExtend.String()) {
			t.Errorf("%s: error %q does not name the limit %v", name, err, DefaultMaxExtend)
		}
		if _, m, _ := s.Store.Peek("o"); !m.Expires.Equal(exp) {
			t.Fatalf("%s: the object now expires at %v (was %v)", name, m.Expires, exp)
		}
	}

	within := time.Now().Add(DefaultMaxExtend - time.Minute).Truncate(time.Millisecond)
	if ok, err := rawExtend(t, addr, r, within.UnixMilli()); err != nil || !ok {
		t.Fatalf("extend within the limit: ok=%v err=%v", ok, err)
	}
	if _, m, _ := s.Store.Peek("o"); !m.Expires.Equal(within) {
		t.Errorf("after an extend within the limit the object expires at %v, want %v", m.Expires, within)
	}

	// The client names the class, so a keep-alive can tell it apart.
	c := &Client{Keys: s.Keys}
	defer c.Close()
	if _, err := c.Extend(context.Background(), r, time.Now().AddDate(1, 0, 0)); !errors.Is(err, ErrExtendTooFar) {
		t.Errorf("client extend beyond the limit: %v, want ErrExtendTooFar", err)
	}
}

// TestExtendedObjectOutlivesItsSealedExpiry: a reference is sealed with the
// object's TTL at birth. A keep-alive (activator-ext while the consumer
// cold-starts) extends the object at its producer; past the sealed expiry
// the consumer still pulls it, and the keep-alive can extend it again. An
// object nobody extended is refused with the expiry error, also when a
// client sends the expired reference straight to the producer.
func TestExtendedObjectOutlivesItsSealedExpiry(t *testing.T) {
	var clock atomic.Int64
	born := time.Now()
	clock.Store(born.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	s := &Server{Store: store.New(1<<20, now), Keys: keys(t, "ns"), Now: now}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	seal := func(id string) string {
		exp := born.Add(2 * time.Second)
		if err := s.Store.Put(context.Background(), store.Meta{ID: id, Bucket: "b", Key: id, Reads: 1, Expires: exp}, []byte(id)); err != nil {
			t.Fatal(err)
		}
		r, err := s.Keys.Seal(ref.Record{Addr: ln.Addr().String(), Key: id, Expires: exp, Reads: 1})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	kept, left := seal("kept"), seal("left")
	c := &Client{Keys: keys(t, "ns"), Now: now}
	defer c.Close()
	ctx := context.Background()

	// The keep-alive's first round, within the TTL: 30 s from now.
	if ok, err := c.Extend(ctx, kept, now().Add(30*time.Second)); err != nil || !ok {
		t.Fatalf("extend within the TTL: %v %v", ok, err)
	}
	clock.Add(int64(10 * time.Second)) // the sealed expiry has passed
	// A later round still reaches the producer.
	if ok, err := c.Extend(ctx, kept, now().Add(30*time.Second)); err != nil || !ok {
		t.Fatalf("extend past the sealed expiry: %v %v", ok, err)
	}
	if got, _, err := c.Pull(ctx, kept); err != nil || string(got) != "kept" {
		t.Fatalf("pull of the extended object past its sealed expiry: %q %v", got, err)
	}
	if _, _, err := c.Pull(ctx, left); !errors.Is(err, ref.ErrExpired) && !errors.Is(err, store.ErrExpired) {
		t.Fatalf("pull of an object nobody extended: %v, want an expiry error", err)
	}
	if _, err := rawExtend(t, ln.Addr().String(), left, now().Add(time.Second).UnixMilli()); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("extend of an expired object straight to the port: %v, want an expiry error", err)
	}
}
