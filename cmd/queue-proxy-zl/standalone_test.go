package main

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
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestMain doubles as the sidecar process: the tests re-run this binary
// with ZT_STANDALONE=1, which runs the real standalone entry point.
func TestMain(m *testing.M) {
	if os.Getenv("ZT_STANDALONE") == "1" {
		os.Exit(standalone(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

type proc struct {
	cmd    *exec.Cmd
	listen string
	sdk    *localapi.Client
	exited chan error
}

// startSidecar runs one standalone queue-proxy-zl process, configured
// through the environment as in a pod, and connects an SDK client.
func startSidecar(t *testing.T, env []string, upstream string) *proc {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "zt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock, shm := filepath.Join(sockDir, "sidecar.sock"), filepath.Join(t.TempDir(), "objects")
	p := &proc{listen: fmt.Sprintf("127.0.0.1:%d", servers.FreePort(t)), exited: make(chan error, 1)}
	p.cmd = exec.Command(os.Args[0], "--listen", p.listen, "--upstream", upstream)
	p.cmd.Env = append(os.Environ(), append(env, "ZT_STANDALONE=1", "SERVING_NAMESPACE=ns", "SERVING_POD_IP=127.0.0.1",
		fmt.Sprintf("ZIPTRAIL_DATAPLANE_PORT=%d", servers.FreePort(t)), "ZIPTRAIL_METRICS_PORT=0",
		"ZIPTRAIL_SOCKET="+sock, "ZIPTRAIL_SHM_DIR="+shm, "ZIPTRAIL_INLINE_THRESHOLD=1024")...)
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	// Ready once the API socket answers (bounded poll, no fixed sleep).
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case err := <-p.exited:
			t.Fatalf("sidecar exited at start: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("sidecar did not open its API socket")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p.sdk, err = localapi.Dial(sock, shm); err != nil {
		t.Fatal(err)
	}
	p.sdk.InlineThreshold = 1024
	t.Cleanup(func() { p.sdk.Close() })
	return p
}

// TestStandaloneSIGTERMBackup: real sidecar processes on loopback and a
// real S3 server. A stock request passes through unchanged; objects put in
// A are read in B; SIGTERM on A backs its unread objects up, after which
// B still gets them (from S3), while an object already read stays gone.
func TestStandaloneSIGTERMBackup(t *testing.T) {
	s3 := servers.StartMinIO(t)
	s3.Bucket(t, "ziptrail")
	keyFile := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{6}, 32))
	if err := os.WriteFile(keyFile, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"ZIPTRAIL_KEY_FILE=" + keyFile, "ZIPTRAIL_S3_ENDPOINT=" + s3.Endpoint,
		"ZIPTRAIL_S3_ACCESS_KEY=" + s3.AccessKey, "ZIPTRAIL_S3_SECRET_KEY=" + s3.SecretKey, "ZIPTRAIL_BACKUP_TIMEOUT_SECONDS=20"}
	user := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-User", "yes")
		fmt.Fprintf(w, "%s %s", r.Method, r.URL.Path)
	}))
	defer user.Close()
	a, b := startSidecar(t, env, user.URL), startSidecar(t, env, user.URL)
	ctx := context.Background()

	resp, err := http.Get("http://" + a.listen + "/plain/path")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "GET /plain/path" || resp.Header.Get("X-User") != "yes" {
		t.Fatalf("stock request: %d %q %v", resp.StatusCode, body, resp.Header)
	}

	objs := make([][]byte, 3)
	refs := make([]string, len(objs))
	for i := range objs {
		objs[i] = make([]byte, 2<<20)
		_, _ = rand.Read(objs[i])
		if refs[i], err = a.sdk.Put(ctx, objs[i], 1); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := b.sdk.Get(ctx, refs[0]); err != nil || !bytes.Equal(got, objs[0]) {
		t.Fatalf("get from a live producer: %v", err)
	}

	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a.exited:
		if err != nil {
			t.Fatalf("producer exit after SIGTERM: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("producer did not exit within 60 s of SIGTERM")
	}
	a.exited <- nil // for the cleanup

	for i := 1; i < len(objs); i++ {
		got, err := b.sdk.Get(ctx, refs[i])
		if err != nil || !bytes.Equal(got, objs[i]) {
			t.Fatalf("unread object %d after the producer's SIGTERM: %d bytes, %v", i, len(got), err)
		}
	}
	_, err = b.sdk.Get(ctx, refs[0])
	if reason := localapi.Reason(err); reason != localapi.ReasonProducerGone {
		t.Fatalf("an object read before SIGTERM must not come back: %q %v", reason, err)
	}
}
