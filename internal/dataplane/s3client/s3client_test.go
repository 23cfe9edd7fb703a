package s3client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/ziptrail/ziptrail/internal/dataplane/s3client"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

func start(t *testing.T) (*servers.MinIO, *s3client.Client, string) {
	t.Helper()
	m := servers.StartMinIO(t)
	c, err := s3client.New(s3client.Config{Endpoint: m.Endpoint, AccessKey: m.AccessKey, SecretKey: m.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	return m, c, m.Bucket(t, "tier")
}

func within(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestRoundTrips: put, get and delete against a real MinIO, for keys that
// need escaping in the signature, empty and 20 MiB bodies; objects written
// by this client read back through minio-go and the other way round.
func TestRoundTrips(t *testing.T) {
	m, c, bucket := start(t)
	ctx := within(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 20<<20/16)
	cases := map[string][]byte{
		"ns/plain":                      []byte("hello"),
		"ns/with space+plus%percent":    []byte("escaped"),
		"ns/ünïcode/ключ/🙂":             []byte("utf-8"),
		"ns/a=b&c;d,e:f@g!h'(i)*j$k~l_": []byte("reserved"),
		"ns/empty":                      {},
		"ns/big":                        big,
	}
	for key, data := range cases {
		if err := c.Put(ctx, bucket, key, data); err != nil {
			t.Fatalf("put %q: %v", key, err)
		}
		got, err := c.Get(ctx, bucket, key)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("get %q: %d bytes, %v (want %d)", key, len(got), err, len(data))
		}
		// What minio-go (another implementation of the same protocol) sees.
		o, err := m.Client.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		other, err := io.ReadAll(o)
		o.Close()
		if err != nil || !bytes.Equal(other, data) {
			t.Fatalf("minio-go reads %q: %d bytes, %v", key, len(other), err)
		}
	}
	if _, err := m.Client.PutObject(ctx, bucket, "ns/from minio-go", strings.NewReader("theirs"), 6, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, bucket, "ns/from minio-go"); err != nil || string(got) != "theirs" {
		t.Fatalf("an object minio-go put: %q, %v", got, err)
	}
	for key := range cases {
		if err := c.Delete(ctx, bucket, key); err != nil {
			t.Fatalf("delete %q: %v", key, err)
		}
		if _, err := c.Get(ctx, bucket, key); !errors.Is(err, s3client.ErrNotFound) {
			t.Fatalf("get %q after delete: %v, want ErrNotFound", key, err)
		}
	}
	if err := c.Delete(ctx, bucket, "ns/never-there"); err != nil {
		t.Fatalf("delete of a missing key: %v (S3 answers 204)", err)
	}
}

// TestFailures: what a careless configuration or a hostile store gets — a
// clear error with the store's code, never ErrNotFound for anything but a
// missing key (a wrong secret must not look like "no backup").
func TestFailures(t *testing.T) {
	m, c, bucket := start(t)
	ctx := within(t)
	if err := c.Put(ctx, bucket, "ns/k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	wrong := func(cfg s3client.Config) *s3client.Client {
		t.Helper()
		cl, err := s3client.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	for name, tc := range map[string]struct {
		client *s3client.Client
		bucket string
		code   string
	}{
		"wrong secret":   {wrong(s3client.Config{Endpoint: m.Endpoint, AccessKey: m.AccessKey, SecretKey: "not-the-secret"}), bucket, "SignatureDoesNotMatch"},
		"unknown key id": {wrong(s3client.Config{Endpoint: m.Endpoint, AccessKey: "nobody", SecretKey: m.SecretKey}), bucket, "InvalidAccessKeyId"},
		"missing bucket": {c, "no-such-bucket", "NoSuchBucket"},
	} {
		_, err := tc.client.Get(ctx, tc.bucket, "ns/k")
		var se *s3client.Error
		if !errors.As(err, &se) || errors.Is(err, s3client.ErrNotFound) || (tc.code != "" && se.Code != tc.code) {
			t.Errorf("%s: get answered %v, want an *Error with code %q that is not ErrNotFound", name, err, tc.code)
		}
		if err := tc.client.Put(ctx, tc.bucket, "ns/k2", []byte("x")); err == nil {
			t.Errorf("%s: put succeeded", name)
		}
	}
	for _, cfg := range []s3client.Config{{}, {Endpoint: "http://host:9000", AccessKey: "a", SecretKey: "b"}, {Endpoint: "h:1", AccessKey: "a"}} {
		if _, err := s3client.New(cfg); err == nil {
			t.Errorf("s3client.New(%+v) accepted", cfg)
		}
	}
	if err := c.Put(ctx, bucket, "", []byte("x")); err == nil {
		t.Error("an empty key was accepted")
	}
	// A store that accepts connections and never answers: the caller's
	// context ends the request.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := wrong(s3client.Config{Endpoint: ln.Addr().String(), AccessKey: "a", SecretKey: "b"}).Get(short, bucket, "ns/k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a store that never answers: %v, want the context's deadline", err)
	}
	// A store announcing an absurd length is refused before anything is
	// allocated; one that sends less than it announced is an error.
	liar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/b/huge" {
			w.Header().Set("Content-Length", "1099511627776") // 1 TiB
		} else {
			w.Header().Set("Content-Length", "100")
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("short"))
	}))
	defer liar.Close()
	lc := wrong(s3client.Config{Endpoint: strings.TrimPrefix(liar.URL, "http://"), AccessKey: "a", SecretKey: "b"})
	if _, err := lc.Get(ctx, "b", "huge"); err == nil || !strings.Contains(err.Error(), "more than an object can be") {
		t.Errorf("a 1 TiB Content-Length: %v", err)
	}
	if got, err := lc.Get(ctx, "b", "short"); err == nil {
		t.Errorf("a body shorter than its Content-Length: %d bytes, no error", len(got))
	}
	// A bare 404 without S3's error document (a proxy, a wrong endpoint)
	// is an error, not a missing object.
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }))
	defer proxy.Close()
	if _, err := wrong(s3client.Config{Endpoint: strings.TrimPrefix(proxy.URL, "http://"), AccessKey: "a", SecretKey: "b"}).Get(ctx, bucket, "ns/k"); err == nil || errors.Is(err, s3client.ErrNotFound) {
		t.Errorf("a bare 404: %v, want an error that is not ErrNotFound", err)
	}
}
