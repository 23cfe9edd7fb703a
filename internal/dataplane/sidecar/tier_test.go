package sidecar

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestSpillAndShutdownBackup: a producer with a 1 MiB memory cap receives
// 2.5 MB of outputs (spilled to a real Redis, nothing lost); then it is
// terminated (SIGTERM path) and every unread object is still readable from
// a real S3 server, even with Redis emptied.
func TestSpillAndShutdownBackup(t *testing.T) {
	rds := servers.StartRedis(t)
	s3 := servers.StartMinIO(t)
	bucket := s3.Bucket(t, "ziptrail")
	keyFile := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{5}, 32))
	if err := os.WriteFile(keyFile, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := func(mem int64) Config {
		return Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(), MemoryLimit: mem,
			InlineThreshold: 1024, ObjectTTL: time.Minute, KeyFile: keyFile, BackupTimeout: 20 * time.Second,
			Redis: &tier.Redis{Client: rds.Client, Prefix: "zt:obj:ns:"},
			S3:    s3.Tier(t, bucket, "ns/")}
	}
	producer := New(cfg(1 << 20))
	pctx, terminate := context.WithCancel(context.Background())
	defer terminate()
	if err := producer.Start(pctx); err != nil {
		t.Fatal(err)
	}
	consumer := start(t, keyFile)
	consumer.cfg.Redis, consumer.cfg.S3 = cfg(0).Redis, cfg(0).S3
	consumer.redis.Store(consumer.cfg.Redis)
	consumer.s3.Store(consumer.cfg.S3)
	consumer.client.Fallback = consumer.tiers()

	objs := make([]invocation.Object, 5)
	for i := range objs {
		objs[i] = invocation.Object{Bucket: "b", Key: fmt.Sprintf("o%d", i), Inline: bytes.Repeat([]byte{byte('a' + i)}, 500_000)}
	}
	pfn := httptest.NewServer(producer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, _ := json.Marshal(invocation.Outputs{Objects: objs})
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		w.Write(out)
	})))
	defer pfn.Close()
	resp, body := post(t, pfn.URL, invocation.Envelope{Namespace: "ns", Function: "p", Session: "s", Invocation: "i"})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	outs, _ := invocation.DecodeOutputs(body)
	if used := producer.Store.Used(); used > 1<<20 {
		t.Errorf("producer holds %d bytes over its 1 MiB cap", used)
	}
	if n, _ := rds.Client.Keys(context.Background(), "zt:obj:ns:*").Result(); len(n) < 3 {
		t.Errorf("only %d objects spilled to Redis", len(n))
	}

	// readAll resolves every reference through the consumer's sidecar.
	readAll := func(what string) {
		t.Helper()
		cfn := httptest.NewServer(consumer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			env, err := invocation.Decode(r.Body)
			if err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			for i, o := range env.Objects {
				got, _ := os.ReadFile(filepath.Join(consumer.cfg.ShmDir, o.Path))
				if !bytes.Equal(got, objs[i].Inline) {
					http.Error(w, fmt.Sprintf("%s: object %s differs (%d bytes)", what, o.Key, len(got)), 500)
					return
				}
			}
		})))
		defer cfn.Close()
		env := invocation.Envelope{Namespace: "ns", Function: "c", Session: "s", Invocation: what}
		for _, o := range outs.Objects {
			env.Objects = append(env.Objects, invocation.Object{Bucket: o.Bucket, Key: o.Key, Ref: o.Ref, Size: o.Size})
		}
		if resp, body := post(t, cfn.URL, env); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", what, resp.StatusCode, body)
		}
	}
	readAll("spilled and in-memory objects, producer alive")

	// SIGTERM: the producer backs up unread objects and goes away.
	terminate()
	select {
	case <-producer.BackedUp():
	case <-time.After(30 * time.Second):
		t.Fatal("backup did not finish")
	}
	producer.server.Close()
	if err := rds.Client.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// Objects that were in memory are now read from S3. (Spilled ones were
	// only in Redis, which we just emptied; the backup covers what was in
	// pod memory.)
	var backed []invocation.Object
	for _, o := range outs.Objects {
		if _, err := s3.Client.StatObject(context.Background(), bucket, "ns/"+objectID(t, consumer, o.Ref), minioStat()); err == nil {
			backed = append(backed, o)
		}
	}
	if len(backed) == 0 {
		t.Fatal("nothing was backed up to S3")
	}
	cfn := httptest.NewServer(consumer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, _ := invocation.Decode(r.Body)
		for _, o := range env.Objects {
			got, _ := os.ReadFile(filepath.Join(consumer.cfg.ShmDir, o.Path))
			if len(got) != 500_000 || got[0] != objs[keyIndex(o.Key)].Inline[0] {
				http.Error(w, "bad content for "+o.Key, 500)
				return
			}
		}
	})))
	defer cfn.Close()
	env := invocation.Envelope{Namespace: "ns", Function: "c", Session: "s", Invocation: "after-sigterm", Objects: backed}
	if resp, body := post(t, cfn.URL, env); resp.StatusCode != 200 {
		t.Fatalf("after SIGTERM: %d %s", resp.StatusCode, body)
	}
	t.Logf("%d objects spilled to Redis, %d backed up to S3 on SIGTERM and read from there", 5-len(backed), len(backed))
}

func objectID(t *testing.T, s *Sidecar, r string) string {
	rec, err := s.keys.Load().Open(r, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return rec.Key
}

func keyIndex(key string) int {
	var i int
	fmt.Sscanf(key, "o%d", &i)
	return i
}

func minioStat() minio.StatObjectOptions { return minio.StatObjectOptions{} }
