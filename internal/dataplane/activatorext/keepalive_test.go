package activatorext

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/onsi/gomega"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

// recording wraps an ExtendFunc and reports every call's result on a
// channel, so a test waits for rounds instead of sleeping.
func recording(f ExtendFunc) (ExtendFunc, chan error) {
	calls := make(chan error, 64)
	return func(ctx context.Context, ns, r string, until time.Time) error {
		err := f(ctx, ns, r, until)
		calls <- err
		return err
	}, calls
}

func TestPeriodicExtendsObjectsAtTheirProducer(t *testing.T) {
	p := startProducer(t)
	t0 := time.Now().Truncate(time.Millisecond)
	refA, refB := p.put(t, "a", t0.Add(time.Second)), p.put(t, "b", t0.Add(time.Second))

	sec := &secrets{}
	sec.set(testNS, p.keys, "k1")
	dp := &DataPlaneExtender{Keys: sec.get}
	defer dp.Close()
	extend, calls := recording(dp.Extend)
	clk, tk := &clock{now: t0}, newTicker()
	m, count := testMetrics(t)
	ka := &Periodic{Extend: extend, Interval: 10 * time.Second, Extension: 30 * time.Second, Now: clk.Now, Tick: tk.Tick, Metrics: m}

	stop := ka.KeepAlive(context.Background(), testNS, []string{refA, refB})
	for range 2 { // first round: at once
		if err := <-calls; err != nil {
			t.Fatalf("first round: %v", err)
		}
	}
	for _, id := range []string{"a", "b"} {
		if got, want := p.expires(t, id), t0.Add(30*time.Second); !got.Equal(want) {
			t.Errorf("after the first round %s expires at %v, want %v", id, got, want)
		}
	}

	clk.Set(t0.Add(10 * time.Second))
	tk.c <- clk.Now()
	for range 2 {
		if err := <-calls; err != nil {
			t.Fatalf("second round: %v", err)
		}
	}
	if got, want := p.expires(t, "a"), t0.Add(40*time.Second); !got.Equal(want) {
		t.Errorf("after the second round a expires at %v, want %v", got, want)
	}

	stop()
	stop() // idempotent
	if !tk.isStopped() {
		t.Error("stop left the ticker running")
	}
	select {
	case err := <-calls:
		t.Errorf("an extension after stop: %v", err)
	default:
	}
	if tk.period != 10*time.Second {
		t.Errorf("ticker period %v, want the interval", tk.period)
	}
	if n := count("ziptrail.activator.keepalive.extends", "result", ResultExtended); n != 4 {
		t.Errorf("extended metric = %d, want 4", n)
	}
	if sec.reads != 1 {
		t.Errorf("the keys were read %d times, want once (cached)", sec.reads)
	}
}

func TestPeriodicDropsGoneObjectsAndRetriesUnreachableProducers(t *testing.T) {
	p := startProducer(t)
	t0 := time.Now()
	gone := p.put(t, "gone", t0.Add(time.Minute))
	p.store.Remove("gone")

	// A producer that is no longer there (its pod died): a retryable error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	_ = ln.Close()
	unreachable, err := p.ring.Seal(ref.Record{Addr: deadAddr, Key: "x", Expires: t0.Add(time.Hour), Reads: 1})
	if err != nil {
		t.Fatal(err)
	}

	tampered := p.put(t, "t", t0.Add(time.Minute))
	tampered = tampered[:len(tampered)-4] + strings.Repeat("A", 4)

	sec := &secrets{}
	sec.set(testNS, p.keys, "k1")
	dp := &DataPlaneExtender{Keys: sec.get}
	defer dp.Close()
	extend, calls := recording(dp.Extend)
	tk := newTicker()
	m, count := testMetrics(t)
	ka := &Periodic{Extend: extend, Tick: tk.Tick, Metrics: m}

	stop := ka.KeepAlive(context.Background(), testNS, []string{gone, unreachable, tampered})
	defer stop()
	var errs []error
	for range 3 {
		errs = append(errs, <-calls)
	}
	if !errors.Is(errs[0], ErrGone) || !errors.Is(errs[2], ErrGone) {
		t.Errorf("a freed object and a tampered reference must be gone: %v, %v", errs[0], errs[2])
	}
	if errs[1] == nil || errors.Is(errs[1], ErrGone) {
		t.Errorf("an unreachable producer must be a retryable error, got %v", errs[1])
	}
	tk.c <- time.Now()
	if err := <-calls; err == nil || errors.Is(err, ErrGone) {
		t.Errorf("second round: want only the unreachable producer retried, got %v", err)
	}
	// The round counts the failure after the call returned; stopping
	// before that would (rightly) not count it.
	gomega.NewWithT(t).Eventually(func() int64 {
		return count("ziptrail.activator.keepalive.extends", "result", ResultError)
	}).Should(gomega.Equal(int64(2)))
	stop()
	select {
	case err := <-calls:
		t.Errorf("gone references were extended again: %v", err)
	default:
	}
	if g, e := count("ziptrail.activator.keepalive.extends", "result", ResultGone), count("ziptrail.activator.keepalive.extends", "result", ResultError); g != 2 || e != 2 {
		t.Errorf("metrics: gone=%d error=%d, want 2 and 2", g, e)
	}
}

func TestPeriodicEndsByItselfWhenEveryObjectIsGone(t *testing.T) {
	p := startProducer(t)
	r := p.put(t, "a", time.Now().Add(time.Minute))
	p.store.Remove("a")
	sec := &secrets{}
	sec.set(testNS, p.keys, "k1")
	dp := &DataPlaneExtender{Keys: sec.get}
	defer dp.Close()
	tk := newTicker()
	stop := (&Periodic{Extend: dp.Extend, Tick: tk.Tick}).KeepAlive(context.Background(), testNS, []string{r})
	stop() // returns only once the loop ended; a ticking loop would need the (never sent) tick
	if !tk.isStopped() {
		t.Error("ticker not stopped")
	}
}

func TestDataPlaneExtenderReloadsRotatedKeys(t *testing.T) {
	p := startProducer(t)
	sec := &secrets{}
	sec.set(testNS, p.keys, "k1")
	clk := &clock{now: time.Now()}
	dp := &DataPlaneExtender{Keys: sec.get, MinReread: 5 * time.Second, Now: clk.Now}
	defer dp.Close()
	until := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	if err := dp.Extend(context.Background(), testNS, p.put(t, "a", time.Now().Add(time.Second)), until); err != nil {
		t.Fatal(err)
	}

	// The operator rotates: k2 seals new references, k1 stays for old ones.
	p.keys["k2"] = bytes.Repeat([]byte{8}, 32)
	if err := p.ring.Set(p.keys, "k2"); err != nil {
		t.Fatal(err)
	}
	sec.set(testNS, p.keys, "k2")
	rotated := p.put(t, "b", time.Now().Add(time.Second))
	// Right after a read, an unknown key id is not read for again: the
	// extend fails, but as retryable (it may be a rotation).
	clk.Set(clk.Now().Add(time.Second))
	if err := dp.Extend(context.Background(), testNS, rotated, until); err == nil || errors.Is(err, ErrGone) || !strings.Contains(err.Error(), "retrying later") {
		t.Fatalf("a new key id 1 s after the last read: %v, want a retryable error", err)
	}
	clk.Set(clk.Now().Add(5 * time.Second))
	if err := dp.Extend(context.Background(), testNS, rotated, until); err != nil {
		t.Fatalf("a reference sealed with a rotated key: %v", err)
	}
	if got := p.expires(t, "b"); !got.Equal(until) {
		t.Errorf("b expires at %v, want %v", got, until)
	}
	if sec.reads != 2 {
		t.Errorf("key reads = %d, want 2 (initial + rotation)", sec.reads)
	}

	// Another namespace has no keys: a retryable error that names it.
	err := dp.Extend(context.Background(), "team-b", p.put(t, "c", time.Now().Add(time.Second)), until)
	if err == nil || errors.Is(err, ErrGone) || !strings.Contains(err.Error(), "team-b") {
		t.Errorf("missing keys: %v", err)
	}
	// The miss is remembered until MinReread has passed.
	sec.set("team-b", p.keys, "k2")
	if err := dp.Extend(context.Background(), "team-b", p.put(t, "d", time.Now().Add(time.Second)), until); err == nil || sec.reads != 3 {
		t.Errorf("right after a failed read: %v after %d reads, want the same error without a read", err, sec.reads)
	}
	// A reference opened in the wrong namespace never extends.
	clk.Set(clk.Now().Add(5 * time.Second))
	if err := dp.Extend(context.Background(), "team-b", p.put(t, "e", time.Now().Add(time.Second)), until); !errors.Is(err, ErrGone) {
		t.Errorf("foreign reference: want ErrGone, got %v", err)
	}
}

func TestParseRefs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   []string
	}{
		{"absent", nil, nil},
		{"one", []string{"zt1.a"}, []string{"zt1.a"}},
		{"comma separated, spaces, empty items", []string{" zt1.a, ,zt1.b ,"}, []string{"zt1.a", "zt1.b"}},
		{"repeated header, duplicates", []string{"zt1.a,zt1.b", "zt1.b,zt1.c"}, []string{"zt1.a", "zt1.b", "zt1.c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := make(map[string][]string)
			for _, v := range tc.values {
				h["Ziptrail-Refs"] = append(h["Ziptrail-Refs"], v)
			}
			got := ParseRefs(h)
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("ParseRefs(%q) = %q, want %q", tc.values, got, tc.want)
			}
		})
	}
	many := make([]string, MaxRefs+10)
	for i := range many {
		many[i] = "zt1." + strings.Repeat("x", i+1)
	}
	if got := ParseRefs(map[string][]string{"Ziptrail-Refs": {strings.Join(many, ",")}}); len(got) != MaxRefs {
		t.Errorf("%d refs kept, want the cap %d", len(got), MaxRefs)
	}
}
