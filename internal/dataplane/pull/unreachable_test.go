package pull

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// Producers that never answer: a pull from one must fall back to the
// storage tiers (a real redis-server here) once its timeout passes, not
// wait for the caller's context to end.

// silentListener accepts nothing: the kernel completes the handshake,
// nothing ever reads the request or answers it.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// stallingProducer accepts connections, reads the magic and one request,
// sends answer, then keeps the connection open without a byte more (until
// the test ends).
func stallingProducer(t *testing.T, answer []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			go func() {
				br := bufio.NewReader(nc)
				var magic [4]byte
				if _, err := io.ReadFull(br, magic[:]); err != nil {
					return
				}
				if _, err := readRequest(br); err != nil {
					return
				}
				_, _ = nc.Write(answer)
			}()
		}
	}()
	return ln.Addr().String()
}

// redisFallback is a real redis-server holding data under id, as the
// fallback chain a consumer's sidecar reads.
func redisFallback(t *testing.T, id string, data []byte) tier.Chain {
	t.Helper()
	rds := servers.StartRedis(t)
	r := &tier.Redis{Client: rds.Client, Prefix: "zt:obj:ns:"}
	if err := r.Put(context.Background(), id, data, time.Hour); err != nil {
		t.Fatal(err)
	}
	return tier.Chain{r}
}

// sealAt seals a reference to object id at addr with the test keys.
func sealAt(t *testing.T, addr, id string) string {
	t.Helper()
	r, err := keys(t, "ns").Seal(ref.Record{Addr: addr, Key: id, Expires: time.Now().Add(time.Hour), Reads: 1})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// unresponsive are the producers that never finish an answer, by the
// stage where they stop.
func unresponsive() []struct {
	name, reason string
	addr         func(t *testing.T, size int) string
} {
	return []struct {
		name, reason string
		addr         func(t *testing.T, size int) string
	}{
		{"blackholed address", "dial_timeout", func(t *testing.T, _ int) string { return servers.Blackhole(t, "127.0.0.1:0") }},
		{"listener that never accepts", "response_timeout", func(t *testing.T, _ int) string { return silentListener(t) }},
		{"half a header, then silence", "response_timeout", func(t *testing.T, size int) string {
			h := (&response{bucket: "b", key: "o", size: uint64(size)}).header()
			return stallingProducer(t, h[:len(h)/2])
		}},
		{"the header and part of the body, then silence", "body_stall", func(t *testing.T, size int) string {
			h := (&response{bucket: "b", key: "o", size: uint64(size)}).header()
			return stallingProducer(t, append(h, make([]byte, size/3)...))
		}},
	}
}

// shortTimeouts make an unresponsive producer's pull fall back quickly;
// no test here needs a live producer to answer within them.
var shortTimeouts = Timeouts{Dial: time.Second, Response: time.Second, Stall: time.Second}

// TestUnresponsiveProducerFallsBackToTier: the object is in Redis (a
// producer's spill or backup); each unresponsive producer ends in the
// fallback with the object's exact bytes, long before the caller's
// (generous) context would have ended the pull, counted under its
// reason. Without a fallback, the pull fails with ErrProducerGone.
// Sequential: each checks its own reason's count.
func TestUnresponsiveProducerFallsBackToTier(t *testing.T) {
	for _, tc := range unresponsive() {
		t.Run(tc.name, func(t *testing.T) {
			want := random(1 << 20)
			fb := redisFallback(t, "obj", want)
			r := sealAt(t, tc.addr(t, len(want)), "obj")
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()

			c := &Client{Keys: keys(t, "ns"), Fallback: fb, Timeouts: shortTimeouts}
			defer c.Close()
			before := testutil.ToFloat64(fallbacks.WithLabelValues(tc.reason))
			got, info, err := c.Pull(ctx, r)
			if err != nil {
				t.Fatalf("pull: %v (want the object from the tier)", err)
			}
			if !bytes.Equal(got, want) || info.Size != int64(len(want)) {
				t.Fatalf("got %d bytes (info %+v), want the tier's %d", len(got), info, len(want))
			}
			if after := testutil.ToFloat64(fallbacks.WithLabelValues(tc.reason)); after != before+1 {
				t.Errorf("fallbacks{reason=%q} went from %v to %v, want one more", tc.reason, before, after)
			}

			bare := &Client{Keys: keys(t, "ns"), Timeouts: shortTimeouts}
			defer bare.Close()
			_, _, err = bare.Pull(ctx, r)
			if !errors.Is(err, ErrProducerGone) || ctx.Err() != nil {
				t.Fatalf("pull without a fallback: %v, want ErrProducerGone before the context's end", err)
			}
			t.Logf("without a fallback: %v", err)
			if _, err := bare.Extend(ctx, r, time.Now().Add(time.Minute)); !errors.Is(err, ErrProducerGone) || ctx.Err() != nil {
				t.Fatalf("extend: %v, want ErrProducerGone before the context's end", err)
			}
		})
	}
}

// TestPooledConnectionToSilencedProducer: a pull over a connection kept
// from an earlier one, to a producer whose link has since gone silent
// (packets dropped both ways), falls back once no answer came.
func TestPooledConnectionToSilencedProducer(t *testing.T) {
	want := random(256 << 10)
	s, _ := startProducer(t, map[string][]byte{"obj": want}, 2)
	rl := startRelay(t, serverAddr(s), 0, 0)
	r := sealAt(t, rl.addr(), "obj")
	c := &Client{Keys: keys(t, "ns"), Fallback: redisFallback(t, "obj", want),
		Timeouts: Timeouts{Dial: 10 * time.Second, Response: 10 * time.Second, Stall: 10 * time.Second}}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if got, _, err := c.Pull(ctx, r); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("first pull, producer live: %d bytes, %v", len(got), err)
	}
	before := testutil.ToFloat64(fallbacks.WithLabelValues(reasonResponseTimeout))
	rl.freeze()
	got, _, err := c.Pull(ctx, r)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("pull after the link went silent: %d bytes, %v (want the tier's copy)", len(got), err)
	}
	if after := testutil.ToFloat64(fallbacks.WithLabelValues(reasonResponseTimeout)); after != before+1 {
		t.Errorf("fallbacks{reason=response_timeout} went from %v to %v, want one more", before, after)
	}
}

func TestTimeoutsValidate(t *testing.T) {
	for _, tc := range []struct {
		t    Timeouts
		want string
	}{
		{Timeouts{}, ""},
		{Timeouts{Dial: time.Second, Response: time.Minute, Stall: MaxTimeout}, ""},
		{Timeouts{Dial: -time.Second}, "pull dial timeout -1s: want a positive duration of at most 1h0m0s"},
		{Timeouts{Stall: 2 * MaxTimeout}, "pull stall timeout 2h0m0s"},
	} {
		err := tc.t.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.t, err, tc.want)
		}
	}
}
