package sidecar

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// startWithAPI runs a sidecar with its local API and returns an SDK client.
func startWithAPI(t *testing.T, keyFile string) (*Sidecar, *localapi.Client) {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "zt") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	cfg := Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: filepath.Join(t.TempDir(), "objects"),
		MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute, KeyFile: keyFile, APISocket: filepath.Join(sockDir, "sidecar.sock"),
		MetricsPort: servers.FreePort(t)}
	s := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	sdk, err := localapi.Dial(cfg.APISocket, cfg.ShmDir)
	if err != nil {
		t.Fatal(err)
	}
	sdk.InlineThreshold = cfg.InlineThreshold
	t.Cleanup(func() { sdk.Close() })
	return s, sdk
}

// TestLocalAPIPutGetInvokeBetweenPods: function A puts an object through
// its sidecar's socket, function B gets it through its own; then A
// invokes B by URL with a large object, which B's sidecar pulls from A
// and hands to B as a shared-memory file.
func TestLocalAPIPutGetInvokeBetweenPods(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{4}, 32))
	if err := os.WriteFile(keyFile, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, sdkA := startWithAPI(t, keyFile)
	b, sdkB := startWithAPI(t, keyFile)
	ctx := context.Background()
	obj := make([]byte, 4<<20)
	_, _ = rand.Read(obj)

	r, err := sdkA.Put(ctx, obj, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sdkB.Get(ctx, r)
	if err != nil || !bytes.Equal(got, obj) {
		t.Fatalf("get in pod B: %d bytes, %v", len(got), err)
	}
	_, err = sdkB.Get(ctx, r)
	if reason := localapi.Reason(err); reason != localapi.ReasonExhausted {
		t.Fatalf("second get of a 1-read object: %q %v", reason, err)
	}

	// B's function reads the object its sidecar resolved into a file.
	fn := httptest.NewServer(b.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, err := invocation.Decode(r.Body)
		if err != nil || len(env.Objects) != 1 || env.Objects[0].Path == "" {
			http.Error(w, fmt.Sprintf("want one resolved object, got %+v (%v)", env, err), http.StatusBadRequest)
			return
		}
		data, err := os.ReadFile(filepath.Join(b.cfg.ShmDir, env.Objects[0].Path))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "%d:%t", len(data), bytes.Equal(data, obj))
	})))
	defer fn.Close()
	resp, err := sdkA.Invoke(ctx, fn.URL, "b", obj)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d:true", len(obj)); resp.GetStatus() != http.StatusOK || string(resp.GetBody()) != want {
		t.Fatalf("invoke: %d %q, want %q", resp.GetStatus(), resp.GetBody(), want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Store.Used() != 0 { // the reader's release reaches A asynchronously
		if time.Now().After(deadline) {
			t.Fatalf("pod A still holds %d bytes after the call", a.Store.Used())
		}
		time.Sleep(5 * time.Millisecond)
	}

	// B's metrics show its store, its pulls and the refused second get.
	resp2, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", b.cfg.MetricsPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	metrics, _ := io.ReadAll(resp2.Body)
	for _, want := range []string{
		"ziptrail_store_capacity_bytes 6.7108864e+07",
		`ziptrail_dataplane_pulls_total{result="ok"}`,
		`ziptrail_dataplane_pulls_total{result="exhausted"}`,
		`ziptrail_localapi_calls_total{method="Get",reason="OBJECT_EXHAUSTED"}`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
