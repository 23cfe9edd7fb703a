package pull

import (
	"context"
	"errors"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3/rpc"

	dp "github.com/ziptrail/ziptrail/internal/dataplane/capnp"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// rawExtend is an attacker's extend: straight to the producer's data-plane
// port with its own Cap'n Proto connection, no pull.Client in between.
func rawExtend(t *testing.T, addr, r string, untilMs int64) (bool, error) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	defer conn.Close()
	ctx := context.Background()
	prod := dp.Producer(conn.Bootstrap(ctx))
	defer prod.Release()
	fut, release := prod.Extend(ctx, func(p dp.Producer_extend_Params) error {
		p.SetUntilUnixMs(untilMs)
		return p.SetRef(r)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return false, err
	}
	return res.Ok(), nil
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
