package sidecar

import (
	"bytes"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestTerminatingServesUntilTheEnd: after SIGTERM (Terminating) a pod's
// sidecar backs its unread objects up at once and keeps serving — Knative
// still proxies requests to the pod while it drains, and their functions
// put and get through the local API and are pulled from over the data
// plane. When the sidecar's context ends (after queue-proxy's drain) the
// objects made during the drain are backed up too, then it stops.
// Before shutdown.go the local API closed right after the SIGTERM backup,
// and a function invoked during the drain failed with "cannot reach the
// sidecar" (bench/sort, a scale-down mid-sort).
func TestTerminatingServesUntilTheEnd(t *testing.T) {
	op := messagingEnv(t)
	s3 := servers.StartMinIO(t)
	bucket := s3.Bucket(t, "ziptrail")
	withS3 := func(c *Config) { c.S3 = s3.Tier(t, bucket, "ns/") }
	a := startMsgPod(t, op, "team-a", "pod-a", withS3)
	b := startMsgPod(t, op, "team-a", "pod-b", withS3)
	ctx, cancel := within(time.Minute)
	defer cancel()
	backedUp := func() int {
		n := 0
		for o := range s3.Client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: "ns/", Recursive: true}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			n++
		}
		return n
	}

	before := bytes.Repeat([]byte("b"), 300<<10)
	if _, err := a.sdk.Put(ctx, before, 1); err != nil {
		t.Fatal(err)
	}
	a.s.Terminating() // SIGTERM
	if n := backedUp(); n != 1 {
		t.Fatalf("%d objects in S3 after SIGTERM, want the 1 unread one", n)
	}
	// A request Knative still routes here during the drain.
	during := bytes.Repeat([]byte("d"), 300<<10)
	r, err := a.sdk.Put(ctx, during, 1)
	if err != nil {
		t.Fatalf("put through the local API during the drain: %v", err)
	}
	read := bytes.Repeat([]byte("r"), 300<<10)
	rr, err := a.sdk.Put(ctx, read, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.sdk.Get(ctx, rr); err != nil || !bytes.Equal(got, read) {
		t.Fatalf("pull from the draining pod: %d bytes, %v", len(got), err)
	}
	select {
	case <-a.s.Stopped():
		t.Fatal("the sidecar stopped before its context ended")
	default:
	}

	a.stop() // the drain is over: sharedmain.Main returned
	select {
	case <-a.s.Stopped():
	case <-ctx.Done():
		t.Fatal("the sidecar did not stop after its context ended")
	}
	// The unread objects of before and during the drain, each once; the
	// one read during the drain is not backed up.
	if n := backedUp(); n != 2 {
		t.Fatalf("%d objects in S3 after the end, want 2", n)
	}
	if got, err := b.sdk.Get(ctx, r); err != nil || !bytes.Equal(got, during) {
		t.Fatalf("the object put during the drain, read after the pod stopped: %d bytes, %v", len(got), err)
	}
}
