package ziptrail

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
)

// tamper changes one character in the middle of a reference's sealed
// part, keeping it valid base64url.
func tamper(ref string) string {
	b := []byte(ref)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// TestErrorClasses: every error class, produced by real sidecars, reaches
// the caller as its sentinel (errors.Is), with the sidecar's reason and a
// message that says what happened; no class is confused with another.
func TestErrorClasses(t *testing.T) {
	keys := keyFile(t, "k1", 5)
	shm := functionShm(t)
	fn := httptest.NewServer(FunctionHandler(func(ctx context.Context, inv *Invocation) ([]byte, error) {
		switch string(inv.Args) {
		case "block":
			<-ctx.Done() // answers only once the caller gave up
			return nil, ctx.Err()
		case "fail":
			return nil, errors.New("the input is not a CSV file")
		}
		return []byte("ok"), nil
	}))
	defer fn.Close()
	a := startSidecar(t, sidecarOpts{keys: keys})
	b := startSidecar(t, sidecarOpts{keys: keys, upstream: fn.URL, shm: shm})
	foreign := startSidecar(t, sidecarOpts{keys: keys, namespace: "other"})
	rotated := startSidecar(t, sidecarOpts{keys: keyFile(t, "k2", 5)})
	small := startSidecar(t, sidecarOpts{keys: keys, env: []string{"ZIPTRAIL_MEMORY_LIMIT=1048576"}})
	full := startSidecar(t, sidecarOpts{keys: keys, env: []string{"ZIPTRAIL_MEMORY_LIMIT=1048576", "ZIPTRAIL_PUT_TIMEOUT=200ms"}})
	producer := startSidecar(t, sidecarOpts{keys: keys})
	ctx := context.Background()

	put := func(s *sidecar, n int, opts ...Option) string {
		t.Helper()
		ref, err := s.client.Put(ctx, make([]byte, 64<<10), n, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return ref
	}
	exhausted := put(a, 1)
	if _, err := b.client.Get(ctx, exhausted); err != nil {
		t.Fatal(err)
	}
	expired := put(a, 1, WithTTL(time.Millisecond))
	gone := put(producer, 1)
	producer.kill()
	time.Sleep(20 * time.Millisecond) // past the 1 ms TTL of expired, whatever the scheduling

	noSidecar, err := NewClient(Config{Socket: filepath.Join(t.TempDir(), "none.sock"), ShmDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer noSidecar.Close()
	timeout, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()

	for _, tc := range []struct {
		name   string
		call   func() error
		want   *Error
		reason string
		msg    string
	}{
		{"malformed", func() error { _, err := b.client.Get(ctx, "zt1.not-a-reference"); return err },
			ErrBadReference, localapi.ReasonMalformed, "malformed reference"},
		{"tampered", func() error { _, err := b.client.Get(ctx, tamper(put(a, 1))); return err },
			ErrBadReference, localapi.ReasonTampered, "tampered"},
		{"foreign namespace", func() error { _, err := foreign.client.Get(ctx, put(a, 1)); return err },
			ErrBadReference, localapi.ReasonForeign, "another namespace"},
		{"unknown key", func() error { _, err := rotated.client.Get(ctx, put(a, 1)); return err },
			ErrBadReference, localapi.ReasonUnknownKey, "unknown key"},
		{"expired", func() error { _, err := b.client.Get(ctx, expired); return err },
			ErrExpired, localapi.ReasonExpired, "expired"},
		{"exhausted", func() error { _, err := b.client.Get(ctx, exhausted); return err },
			ErrExhausted, localapi.ReasonExhausted, ""},
		{"producer gone", func() error { _, err := b.client.Get(ctx, gone); return err },
			ErrProducerGone, localapi.ReasonProducerGone, ""},
		// The callee's sidecar cannot resolve the input: it answers 424
		// naming the class, and the SDK reports that class.
		{"invoke with an exhausted reference", func() error { _, err := b.client.InvokeRef(ctx, b.url(), exhausted); return err },
			ErrExhausted, localapi.ReasonExhausted, "answered 424"},
		{"invoke with a gone producer's reference", func() error { _, err := b.client.InvokeRef(ctx, b.url(), gone); return err },
			ErrProducerGone, localapi.ReasonProducerGone, "answered 424"},
		{"invoke into another namespace", func() error { _, err := a.client.Invoke(ctx, foreign.url(), make([]byte, 1<<20)); return err },
			ErrBadReference, localapi.ReasonForeign, "answered 424"},
		{"not found", func() error { _, err := b.client.GetObject(ctx, "results", "nothing-sent"); return err },
			ErrNotFound, localapi.ReasonNotFound, "results/nothing-sent"},
		{"too large", func() error { _, err := small.client.Put(ctx, make([]byte, 2<<20), 1); return err },
			ErrTooLarge, localapi.ReasonTooLarge, ""},
		{"store full", func() error {
			// An unread object holds 768 KiB of the 1 MiB cap; with no fast
			// tier to spill to, the next put waits, then gives up.
			if _, err := full.client.Put(ctx, make([]byte, 768<<10), 1); err != nil {
				return err
			}
			_, err := full.client.Put(ctx, make([]byte, 512<<10), 1)
			return err
		}, ErrStoreFull, localapi.ReasonStoreFull, ""},
		{"persist without a tier", func() error {
			_, err := b.client.SendObject(ctx, CreateObject("b", "k").SetData([]byte("x")), true)
			return err
		}, ErrInvalid, localapi.ReasonBadPayload, "no S3 tier"},
		{"zero reads", func() error { _, err := a.client.Put(ctx, nil, 0); return err }, ErrInvalid, "", "at least 1"},
		{"no sidecar", func() error { _, err := noSidecar.Put(ctx, []byte("x"), 1); return err },
			ErrUnavailable, "", "queue-proxy-zl"},
		{"timeout", func() error {
			_, err := a.client.Invoke(timeout, b.url(), []byte("x"), WithArgs([]byte("block")))
			if !errors.Is(err, context.DeadlineExceeded) {
				return errors.New("a timeout must also satisfy errors.Is(err, context.DeadlineExceeded)")
			}
			return err
		}, ErrTimeout, "", ""},
		{"function failed", func() error {
			resp, err := a.client.Invoke(ctx, b.url(), []byte("x"), WithArgs([]byte("fail")))
			if resp == nil || resp.StatusCode != 500 {
				return errors.New("a failed call must return the function's response too")
			}
			return err
		}, ErrFunctionFailed, "", "the input is not a CSV file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			t.Log(err)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want kind %s", err, tc.want.Kind)
			}
			var e *Error
			_ = errors.As(err, &e)
			if e.Reason != tc.reason || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), string(tc.want.Kind)) {
				t.Errorf("error %q: reason %q, want %q in a message containing %q", err, e.Reason, tc.reason, tc.msg)
			}
			if strings.Contains(err.Error(), "rpc error") {
				t.Errorf("message shows gRPC's wrapping: %q", err)
			}
			for _, other := range []*Error{ErrBadReference, ErrExpired, ErrExhausted, ErrProducerGone, ErrNotFound, ErrTimeout, ErrUnavailable, ErrInvalid} {
				if other != tc.want && errors.Is(err, other) {
					t.Errorf("%v also matches %s", err, other.Kind)
				}
			}
		})
	}

	// The gRPC status stays reachable for callers that want the code.
	_, err = b.client.Get(ctx, "zt1.x")
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("status code of a malformed reference: %v", status.Code(err))
	}
}
