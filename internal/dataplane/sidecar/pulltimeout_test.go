package sidecar

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestBlackholedProducerFallsBackToBackup is the e2e's "backs up a
// terminating producer pod's unread objects to S3" with the producer's
// address lost afterwards instead of refusing connections: the producer
// (a real sidecar) backs its unread output up to a real MinIO on SIGTERM
// and stops; its address then drops every SYN (a lost node). The
// consumer's sidecar, configured from the environment like a pod's
// (tiers, 1 s pull timeouts), still resolves the reference on an
// invocation and on its function's Get: from S3, once the connect timed
// out, not when the caller gives up; its metrics count both fallbacks.
func TestBlackholedProducerFallsBackToBackup(t *testing.T) {
	s3 := servers.StartMinIO(t)
	bucket := s3.Bucket(t, "ziptrail")
	keyFile := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{6}, 32))
	if err := os.WriteFile(keyFile, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}

	// The producer returns a 2 MB object, kept in its memory.
	want := bytes.Repeat([]byte("lost node "), 200_000)
	producer := New(Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(),
		MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute, KeyFile: keyFile, BackupTimeout: 20 * time.Second,
		S3: s3.Tier(t, bucket, "ns/")})
	pctx, terminate := context.WithCancel(context.Background())
	defer terminate()
	if err := producer.Start(pctx); err != nil {
		t.Fatal(err)
	}
	pfn := httptest.NewServer(producer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, _ := json.Marshal(invocation.Outputs{Objects: []invocation.Object{{Bucket: "b", Key: "big", Inline: want}}})
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		w.Write(out)
	})))
	defer pfn.Close()
	resp, body := post(t, pfn.URL, invocation.Envelope{Namespace: "ns", Function: "p", Session: "s", Invocation: "p1"})
	if resp.StatusCode != 200 {
		t.Fatalf("producer: %d %s", resp.StatusCode, body)
	}
	outs, err := invocation.DecodeOutputs(body)
	if err != nil || len(outs.Objects) != 1 || outs.Objects[0].Ref == "" {
		t.Fatalf("producer outputs: %v %+v", err, outs)
	}
	big := outs.Objects[0]

	// SIGTERM: backed up, servers closed; then the address is lost.
	terminate()
	<-producer.Stopped()
	producer.server.Close()
	servers.Blackhole(t, producer.addr())

	// The consumer, configured as in a pod.
	sockDir, err := os.MkdirTemp("", "zt") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	for k, v := range map[string]string{
		"SERVING_NAMESPACE": "ns", "ZIPTRAIL_KEY_FILE": keyFile,
		"ZIPTRAIL_S3_ENDPOINT": s3.Endpoint, "ZIPTRAIL_S3_ACCESS_KEY": s3.AccessKey, "ZIPTRAIL_S3_SECRET_KEY": s3.SecretKey, "ZIPTRAIL_S3_BUCKET": bucket,
		"ZIPTRAIL_PULL_DIAL_TIMEOUT": "1s", "ZIPTRAIL_PULL_RESPONSE_TIMEOUT": "1s", "ZIPTRAIL_PULL_STALL_TIMEOUT": "1s",
	} {
		t.Setenv(k, v)
	}
	cfg := FromEnv()
	cfg.PodIP, cfg.DataplanePort, cfg.ShmDir = "127.0.0.1", servers.FreePort(t), filepath.Join(t.TempDir(), "objects")
	cfg.APISocket, cfg.MetricsPort = filepath.Join(sockDir, "sidecar.sock"), servers.FreePort(t)
	consumer := New(cfg)
	cctx, stop := context.WithCancel(context.Background())
	defer stop()
	if err := consumer.Start(cctx); err != nil {
		t.Fatal(err)
	}
	if got, w := consumer.client.Timeouts, (pull.Timeouts{Dial: time.Second, Response: time.Second, Stall: time.Second}); got != w {
		t.Fatalf("the consumer pulls with %+v, want %+v from the environment", got, w)
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", cfg.MetricsPort)
	dialTimeouts := metricSample(t, metricsURL, `ziptrail_dataplane_pull_fallbacks_total{reason="dial_timeout"}`)
	s3Reads := metricSample(t, metricsURL, `ziptrail_dataplane_fallback_reads_total{tier="s3"}`)

	// An invocation with the reference: its input resolves from S3.
	cfn := httptest.NewServer(consumer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, err := invocation.Decode(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		got, _ := os.ReadFile(filepath.Join(cfg.ShmDir, env.Objects[0].Path))
		if !bytes.Equal(got, want) {
			http.Error(w, fmt.Sprintf("input of %d bytes, not the object", len(got)), 500)
		}
	})))
	defer cfn.Close()
	data, _ := json.Marshal(invocation.Envelope{Namespace: "ns", Function: "c", Session: "s", Invocation: "c1",
		Objects: []invocation.Object{{Bucket: big.Bucket, Key: big.Key, Ref: big.Ref, Size: big.Size}}})
	hc := &http.Client{Timeout: 90 * time.Second} // the caller's patience, far beyond the pull timeouts
	resp, err = hc.Post(cfn.URL, invocation.ContentType, bytes.NewReader(data))
	if err != nil {
		t.Fatalf("invocation with an input from a lost producer: %v", err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("invocation: %d %s", resp.StatusCode, body)
	}

	// The function's own Get of the reference.
	sdk, err := localapi.Dial(cfg.APISocket, cfg.ShmDir)
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	got, err := sdk.Get(ctx, big.Ref)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("Get: %d bytes, %v (want the backed-up object)", len(got), err)
	}

	if n := metricSample(t, metricsURL, `ziptrail_dataplane_pull_fallbacks_total{reason="dial_timeout"}`); n != dialTimeouts+2 {
		t.Errorf("dial_timeout fallbacks: %v, want %v", n, dialTimeouts+2)
	}
	if n := metricSample(t, metricsURL, `ziptrail_dataplane_fallback_reads_total{tier="s3"}`); n != s3Reads+2 {
		t.Errorf("reads from S3: %v, want %v", n, s3Reads+2)
	}
}

// metricSample scrapes one sample from a sidecar's metrics (0 when absent).
func metricSample(t *testing.T, url, sample string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(text)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatalf("%s: %v", sample, err)
	}
	return v
}

// TestPullTimeoutsConfig: the variables set the client's timeouts; a
// malformed or out-of-range value (or a negative field in a Config)
// stops the sidecar at Start with a message naming it.
func TestPullTimeoutsConfig(t *testing.T) {
	t.Setenv("ZIPTRAIL_PULL_DIAL_TIMEOUT", "3s")
	t.Setenv("ZIPTRAIL_PULL_RESPONSE_TIMEOUT", "1m")
	t.Setenv("ZIPTRAIL_PULL_STALL_TIMEOUT", "45s")
	c := FromEnv()
	if want := (pull.Timeouts{Dial: 3 * time.Second, Response: time.Minute, Stall: 45 * time.Second}); c.PullTimeouts != want || c.Validate() != nil {
		t.Fatalf("from the environment: %+v (%v), want %+v", c.PullTimeouts, c.Validate(), want)
	}
	t.Setenv("ZIPTRAIL_PULL_DIAL_TIMEOUT", "")
	t.Setenv("ZIPTRAIL_PULL_RESPONSE_TIMEOUT", "")
	t.Setenv("ZIPTRAIL_PULL_STALL_TIMEOUT", "")
	if c := FromEnv(); c.PullTimeouts != (pull.Timeouts{}) || c.Validate() != nil {
		t.Fatalf("unset: %+v (%v), want the defaults", c.PullTimeouts, c.Validate())
	}

	for _, tc := range []struct {
		env, value, want string
	}{
		{"ZIPTRAIL_PULL_DIAL_TIMEOUT", "10", `ZIPTRAIL_PULL_DIAL_TIMEOUT="10": want a positive duration of at most 1h0m0s, such as 10s`},
		{"ZIPTRAIL_PULL_RESPONSE_TIMEOUT", "0s", `ZIPTRAIL_PULL_RESPONSE_TIMEOUT="0s": want a positive duration`},
		{"ZIPTRAIL_PULL_STALL_TIMEOUT", "-5s", `ZIPTRAIL_PULL_STALL_TIMEOUT="-5s": want a positive duration`},
		{"ZIPTRAIL_PULL_STALL_TIMEOUT", "2h", `ZIPTRAIL_PULL_STALL_TIMEOUT="2h": want a positive duration of at most 1h0m0s`},
	} {
		t.Setenv(tc.env, tc.value)
		cfg := FromEnv()
		cfg.PodIP, cfg.DataplanePort, cfg.ShmDir, cfg.APISocket, cfg.MetricsPort = "127.0.0.1", 0, t.TempDir(), "", 0
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		err := New(cfg).Start(ctx)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%q: Start: %v, want an error containing %q", tc.env, tc.value, err, tc.want)
		}
		t.Setenv(tc.env, "")
	}
	cfg := Config{Namespace: "ns", PodIP: "127.0.0.1", ShmDir: t.TempDir(), PullTimeouts: pull.Timeouts{Response: -time.Second}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := New(cfg).Start(ctx); err == nil || !strings.Contains(err.Error(), "pull response timeout -1s") {
		t.Errorf("a negative timeout in the Config: Start: %v", err)
	}
}
