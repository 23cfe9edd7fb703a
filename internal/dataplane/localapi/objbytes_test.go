package localapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

// TestObjectSocketPutsAndGets: with the object socket served, a small
// put and every get take one message each way (no gRPC call), and behave
// as the gRPC calls do: N reads then exhausted, local and remote sources,
// a large object as a lent file, the classes of bad references, a
// producer gone.
func TestObjectSocketPutsAndGets(t *testing.T) {
	a, b := startPod(t, podOpts{objects: true}), startPod(t, podOpts{objects: true})
	ctx := context.Background()
	grpcBefore := testutil.ToFloat64(calls.WithLabelValues("Put", "")) + testutil.ToFloat64(calls.WithLabelValues("Get", ""))
	putsBefore := testutil.ToFloat64(objFrames.WithLabelValues("put_bytes"))

	small := []byte("ten bytes!")
	rs, err := a.sdk.Put(ctx, small, 2)
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(objFrames.WithLabelValues("put_bytes")) - putsBefore; n != 1 {
		t.Fatalf("the small put took %v object-socket puts, want 1", n)
	}
	for i := 0; i < 2; i++ {
		resp, m, err := b.sdk.GetMapped(ctx, rs)
		if err != nil || !bytes.Equal(m.Data, small) || resp.GetSource() != "remote" || m.Mapped {
			t.Fatalf("small read %d: %q %+v %v", i, m.Data, resp, err)
		}
		m.Close()
	}
	_, _, err = b.sdk.GetMapped(ctx, rs)
	wantReason(t, "third read of a 2-read object", err, ReasonExhausted)

	own, err := b.sdk.Put(ctx, small, 1)
	if err != nil {
		t.Fatal(err)
	}
	if resp, m, err := b.sdk.GetMapped(ctx, own); err != nil || resp.GetSource() != "local" || !bytes.Equal(m.Data, small) {
		t.Fatalf("own small object: %+v %v", resp, err)
	}
	// The counters count these as the calls they stand for: the small
	// puts and every get, none of them on the gRPC socket.
	grpc := testutil.ToFloat64(calls.WithLabelValues("Put", "")) + testutil.ToFloat64(calls.WithLabelValues("Get", "")) - grpcBefore
	if grpc != 2+3 {
		t.Errorf("calls counted: %v, want 5 (2 puts, 3 gets)", grpc)
	}

	large := random(3<<20 + 1)
	_, m := getLent(t, ctx, a, b, large)
	m.Close()

	// Bad references: the classes the gRPC Get gives.
	good, err := a.sdk.Put(ctx, []byte("x"), 1)
	if err != nil {
		t.Fatal(err)
	}
	tampered := []byte(good)
	if tampered[len(tampered)-5] == 'A' { // another valid base64url character
		tampered[len(tampered)-5] = 'B'
	} else {
		tampered[len(tampered)-5] = 'A'
	}
	foreign, _ := keyring(t, "other", "k1").Seal(ref.Record{Addr: a.api.Addr, Key: "put-1", Reads: 1})
	for _, tc := range []struct{ name, ref, reason string }{
		{"malformed", "zt1.%%%", ReasonMalformed},
		{"empty", "", ReasonMalformed},
		{"tampered", string(tampered), ReasonTampered},
		{"foreign namespace", foreign, ReasonForeign},
	} {
		_, _, err := b.sdk.GetMapped(ctx, tc.ref)
		wantReason(t, tc.name, err, tc.reason)
	}

	// The producer gone: its class, and no partial file left.
	r, err := a.sdk.Put(ctx, random(2<<20), 1)
	if err != nil {
		t.Fatal(err)
	}
	a.server.Close()
	_, _, err = b.sdk.GetMapped(ctx, r)
	wantReason(t, "producer closed", err, ReasonProducerGone)
	if left := entries(t, b.dir); len(left) > 1 { // the lent file, idle
		t.Errorf("files left behind: %v", left)
	}
}

// TestObjectSocketAboveItsMessage: a sidecar whose inline threshold is
// above what one message carries answers a get of a mid-sized object
// with a file, and a client whose threshold is above it puts by file.
func TestObjectSocketAboveItsMessage(t *testing.T) {
	a, b := startPod(t, podOpts{objects: true}), startPod(t, podOpts{objects: true})
	for _, p := range []*pod{a, b} {
		p.api.InlineThreshold, p.sdk.InlineThreshold = 1<<20, 1<<20
	}
	ctx := context.Background()
	obj := random(objInlineMax + 1000)
	r, err := a.sdk.Put(ctx, obj, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*pod{b, a} { // remote, then local
		resp, m, err := p.sdk.GetMapped(ctx, r)
		if err != nil || !bytes.Equal(m.Data, obj) || !m.Mapped {
			t.Fatalf("get: %+v mapped %v, %v", resp, m != nil && m.Mapped, err)
		}
		m.Close()
	}
}

// TestObjectSocketBytesAttacks: the function is hostile on the object
// socket's ops 4 and 5 too. Lengths that run past the message, an object
// over the message's bound, releases that name paths or files the
// sidecar never lent: each a clear BAD_PAYLOAD or a reference class, the
// connection still served, nothing stored, no file touched.
func TestObjectSocketBytesAttacks(t *testing.T) {
	p := startPod(t, podOpts{objects: true})
	conn := dialObjects(t, p)
	planted := filepath.Join(p.dir, "planted")
	if err := os.WriteFile(planted, []byte("the function's own"), 0o600); err != nil {
		t.Fatal(err)
	}
	put := func(sessionLen uint16, session string, data []byte) []byte {
		b := append([]byte("ZTO1"), objPutBytes)
		b = binary.LittleEndian.AppendUint32(b, 1)
		b = binary.LittleEndian.AppendUint64(b, 0)
		b = binary.LittleEndian.AppendUint16(b, sessionLen)
		return append(append(b, session...), data...)
	}
	get := func(relLen uint16, rel, r string) []byte {
		b := append([]byte("ZTO1"), objGetAny, getLend)
		b = binary.LittleEndian.AppendUint16(b, relLen)
		return append(append(b, rel...), r...)
	}
	for _, tc := range []struct {
		name, reason, want string
		msg                []byte
	}{
		{"a put cut short", ReasonBadPayload, "short", put(0, "", nil)[:10]},
		{"a session past the message", ReasonBadPayload, "session", put(500, "s", []byte("x"))},
		{"an object over the message's bound", ReasonBadPayload, "at most", put(0, "", make([]byte, objInlineMax+1))},
		{"a get cut short", ReasonBadPayload, "short", get(0, "", "")[:6]},
		{"releases past the message", ReasonBadPayload, "releases", get(900, "x", "zt1.x")},
		{"an empty reference", ReasonMalformed, "", get(0, "", "")},
		{"forged releases, then a bad reference", ReasonMalformed, "", func() []byte {
			rel := "../planted:1,/etc/passwd:1,planted:1,planted,,:"
			return get(uint16(len(rel)), rel, "zt1.%%%")
		}()},
	} {
		st, body, fds, err := objRequest(t, conn, tc.msg)
		if err != nil || st != objError || len(fds) != 0 {
			t.Fatalf("%s: status %d, %d descriptors, %v", tc.name, st, len(fds), err)
		}
		serr := objStatus(body)
		if Reason(serr) != tc.reason || !strings.Contains(serr.Error(), tc.want) {
			t.Fatalf("%s: %v (reason %s), want %s mentioning %q", tc.name, serr, Reason(serr), tc.reason, tc.want)
		}
	}
	if st, _, _, err := objRequest(t, conn, []byte("ZTO1\x01")); err != nil || st != objOK {
		t.Fatalf("the connection is no longer served: %d %v", st, err)
	}
	if p.api.Store.Len() != 0 {
		t.Errorf("the store holds %d objects", p.api.Store.Len())
	}
	if b, err := os.ReadFile(planted); err != nil || string(b) != "the function's own" {
		t.Errorf("a file the sidecar never lent was touched: %q %v", b, err)
	}
}

// FuzzObjectSocket sends arbitrary messages to a served object socket
// (ops 4 and 5 seeded; any op may come): the sidecar answers each with a
// well-formed response or ends the connection, never panics, and a
// well-formed hello is served afterwards on a new connection.
func FuzzObjectSocket(f *testing.F) {
	p := startPod(f, podOpts{objects: true, timeout: 50 * time.Millisecond}) // a full store answers at once
	r, err := p.sdk.Put(context.Background(), []byte("seed"), 1<<30)
	if err != nil {
		f.Fatal(err)
	}
	put := append([]byte("ZTO1\x04\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00s"), "data"...)
	f.Add(put)
	f.Add(append([]byte("ZTO1\x05\x01\x00\x00"), r...))
	f.Add(append([]byte("ZTO1\x05\x00\x05\x00a:1,b"), r...))
	f.Add([]byte("ZTO1\x05\x01\xff\xff"))
	f.Add([]byte("ZTO1\x04\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		conn := dialObjects(t, p)
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write(msg); err != nil {
			return
		}
		buf := make([]byte, maxObjMessage+64)
		n, err := conn.Read(buf)
		if err != nil || n == 0 {
			return // the connection ended
		}
		if n < 5 || string(buf[:4]) != "ZTO1" || buf[4] > objFallback {
			t.Fatalf("malformed response %q", buf[:min(n, 64)])
		}
		c2 := dialObjects(t, p)
		if st, _, _, err := objRequest(t, c2, []byte("ZTO1\x01")); err != nil || st != objOK {
			t.Fatalf("the socket no longer serves a hello: %d %v", st, err)
		}
	})
}
