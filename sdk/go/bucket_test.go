package ziptrail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// The metadata keys are the ones the engine reads (the group key is the
// DynamicGroup default; admin's session test runs both through the
// engine).
func TestMetadataKeys(t *testing.T) {
	for got, want := range map[string]string{MetaExpectedKeys: engine.MetaExpectedKeys, MetaExpectedCount: engine.MetaExpectedCount,
		MetaDeclareOnly: engine.MetaDeclareOnly} {
		if got != want {
			t.Errorf("SDK key %q, engine key %q", got, want)
		}
	}
	o := CreateObject("b", "k").SetGroup("g").ExpectKeys("p1", "p2").ExpectCount(2).DeclareOnly().SetGroupKey("word", "w")
	fmt.Fprint(o, "da", "ta")
	want := map[string]string{"group": "g", "ziptrail.expected-keys": "p1,p2", "ziptrail.expected-count": "2", "ziptrail.declare-only": "true", "word": "w"}
	if fmt.Sprint(o.Metadata) != fmt.Sprint(want) || string(o.Data) != "data" {
		t.Errorf("object %+v", o)
	}
}

// TestBucketObjects: objects sent through the sidecar outside a handler
// are read back by key within their session; in a handler, persist sends
// through the sidecar into the S3 tier (another pod reads it from there)
// while a plain send travels with the response.
func TestBucketObjects(t *testing.T) {
	s3 := servers.StartMinIO(t)
	s3.Bucket(t, "ziptrail")
	tier := []string{"ZIPTRAIL_S3_ENDPOINT=" + s3.Endpoint, "ZIPTRAIL_S3_ACCESS_KEY=" + s3.AccessKey, "ZIPTRAIL_S3_SECRET_KEY=" + s3.SecretKey}
	keys := keyFile(t, "k1", 6)
	ctx := context.Background()

	a := startSidecar(t, sidecarOpts{keys: keys})
	big := random(t, 2<<20)
	sent, err := a.client.SendObject(ctx, CreateObject("results", "r1").SetData(big).SetGroup("g1"), false, WithSession("s1"))
	if err != nil || sent.Ref == "" || sent.Size != int64(len(big)) || sent.Persisted {
		t.Fatalf("send a large object: %+v %v", sent, err)
	}
	if sent, err := a.client.SendObject(ctx, CreateObject("results", "small").SetData([]byte("x")), false, WithSession("s1")); err != nil || sent.Ref != "" {
		t.Fatalf("a small object travels inline (no reference): %+v %v", sent, err)
	}
	obj, err := a.client.GetObject(ctx, "results", "r1", WithSession("s1"))
	if err != nil || !bytes.Equal(obj.Bytes(), big) || !obj.Mapped() || obj.Bucket != "results" || obj.Key != "r1" {
		t.Fatalf("get object: %v", err)
	}
	obj.Close()
	if _, err := a.client.GetObject(ctx, "results", "r1", WithSession("s2")); !errors.Is(err, ErrNotFound) {
		t.Errorf("another session's object: %v", err)
	}
	// Outside a handler Send takes the default client's local API; the
	// response-only shorthand refuses.
	old := SetDefault(a.client)
	defer SetDefault(old)
	if err := CreateObject("results", "r2").SetData([]byte("via default")).Send(ctx, false); err != nil {
		t.Fatal(err)
	}
	if obj, err := GetObject(ctx, "results", "r2"); err != nil || string(obj.Bytes()) != "via default" {
		t.Fatalf("package-level get object: %v", err)
	}
	if err := SendObject(ctx, "results", "r3", nil, nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("SendObject outside a handler: %v", err)
	}

	// A function behind pod B persists one object and sends another.
	var b *sidecar
	shm := functionShm(t)
	fn := httptest.NewServer(FunctionHandler(func(ctx context.Context, inv *Invocation) ([]byte, error) {
		if err := CreateObject("models", "m").SetData(inv.Objects[0].Bytes()).Send(ctx, true); err != nil {
			return nil, err
		}
		return nil, CreateObject("events", "done").SetData([]byte("ok")).SetGroup("e").Send(ctx, false)
	}))
	defer fn.Close()
	b = startSidecar(t, sidecarOpts{keys: keys, upstream: fn.URL, env: tier, shm: shm})
	SetDefault(b.client) // the function's process shares pod B
	resp, err := a.client.Invoke(ctx, b.url(), big, WithSession("s3"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Outputs) != 1 || resp.Outputs[0].Key != "done" || resp.Outputs[0].Metadata[MetaGroup] != "e" {
		t.Errorf("only the plain send returns with the response: %+v", resp.Outputs)
	}
	c := startSidecar(t, sidecarOpts{keys: keys, env: tier})
	obj, err = c.client.GetObject(ctx, "models", "m", WithSession("s3"))
	if err != nil || obj.Source != "s3" || !bytes.Equal(obj.Bytes(), big) {
		t.Fatalf("persisted object from another pod: %v (source %q)", err, obj.Source)
	}
	obj.Close()
}

// TestLargeSendObjectFromAHandler: a handler's object larger than the
// response may carry (the sidecar's cap on a response with outputs is
// 64 MiB) is put into the pod's object store at once and travels in the
// response as a reference; before, the sidecar refused the response
// ("function outputs: they exceed 67108864 bytes"). Small ones stay inline.
func TestLargeSendObjectFromAHandler(t *testing.T) {
	keys := keyFile(t, "k1", 7)
	ctx := context.Background()
	big := bytes.Repeat([]byte("0123456789abcdef"), 80<<20/16) // 80 MiB
	shm := functionShm(t)
	fn := httptest.NewServer(FunctionHandler(func(ctx context.Context, inv *Invocation) ([]byte, error) {
		if err := SendObject(ctx, "big", "b", big, map[string]string{"part": "1"}); err != nil {
			return nil, err
		}
		return nil, SendObject(ctx, "small", "s", []byte("tiny"), nil)
	}))
	defer fn.Close()
	a := startSidecar(t, sidecarOpts{keys: keys})
	b := startSidecar(t, sidecarOpts{keys: keys, upstream: fn.URL, shm: shm, env: []string{"ZIPTRAIL_MEMORY_LIMIT=" + strconv.Itoa(256<<20)}})
	old := SetDefault(b.client) // the function's process shares pod B
	t.Cleanup(func() { SetDefault(old) })
	resp, err := a.client.Invoke(ctx, b.url(), []byte("go"), WithSession("s1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Outputs) != 2 {
		t.Fatalf("outputs %+v", resp.Outputs)
	}
	o := resp.Outputs[0]
	if o.Key != "b" || o.Ref == "" || o.Inline != nil || o.Size != int64(len(big)) || o.Metadata["part"] != "1" {
		t.Fatalf("the large object: %+v", Output{Bucket: o.Bucket, Key: o.Key, Size: o.Size, Ref: o.Ref, Metadata: o.Metadata})
	}
	if s := resp.Outputs[1]; s.Ref != "" || string(s.Inline) != "tiny" {
		t.Errorf("the small object: %+v", s)
	}
	got, err := a.client.Get(ctx, o.Ref)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if !bytes.Equal(got.Bytes(), big) {
		t.Fatal("the large object's bytes differ")
	}
}
