package sidecar

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// The sidecar's annotation keys are the ones the Workflow controller writes.
func TestAnnotationKeysMatchTheAPI(t *testing.T) {
	for got, want := range map[string]string{annWorkflow: v1alpha1.AnnotationWorkflow, annFunction: v1alpha1.AnnotationFunction,
		annControlAddr: v1alpha1.AnnotationControlAddr, annMemoryLimit: v1alpha1.AnnotationMemoryLimit,
		annInlineThreshold: v1alpha1.AnnotationInlineThreshold, annObjectTTL: v1alpha1.AnnotationObjectTTL} {
		if got != want {
			t.Errorf("sidecar reads %q, the controller writes %q", got, want)
		}
	}
}

// A file as the kubelet writes it (fieldpath.FormatMap: sorted key=%q lines).
func TestParsePodInfo(t *testing.T) {
	data := fmt.Sprintf("%s=%q\n%s=%q\n%s=%q\n%s=%q\n", "autoscaling.knative.dev/min-scale", "2",
		"weird", "a \"quoted\"\nline\twith\\ escapes and ünïcode", "ziptrail.dev/control-addr", "ziptrail-control.sys.svc:9443",
		"ziptrail.dev/object-ttl", "7m0s")
	a, err := ParsePodInfo([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if a["weird"] != "a \"quoted\"\nline\twith\\ escapes and ünïcode" || a["ziptrail.dev/control-addr"] != "ziptrail-control.sys.svc:9443" || len(a) != 4 {
		t.Fatalf("parsed %q", a)
	}
	if a, err := ParsePodInfo(nil); err != nil || len(a) != 0 {
		t.Fatalf("empty file: %v %v", a, err)
	}
}

// Malformed files are errors naming the problem, never panics or silently
// half-read settings.
func TestParsePodInfoRefusesMalformedFiles(t *testing.T) {
	for name, data := range map[string]string{
		"no equals":        "ziptrail.dev/workflow\n",
		"empty key":        "=\"x\"\n",
		"unquoted value":   "k=v\n",
		"unterminated":     "k=\"abc\n",
		"bad escape":       "k=\"\\q\"\n",
		"trailing garbage": "k=\"a\"b\n",
		"lone quote":       "k=\"\n",
		"duplicate":        "k=\"a\"\nk=\"b\"\n",
		"space in key":     "a b=\"c\"\n",
		"invalid utf8":     "k=\"\xff\"\n",
		"nul":              "k=\"a\x00\"\n",
		"oversized":        "k=\"" + strings.Repeat("x", MaxPodInfoBytes) + "\"\n",
	} {
		a, err := ParsePodInfo([]byte(data))
		if err == nil {
			t.Errorf("%s: accepted as %q", name, a)
		}
	}
}

func FuzzParsePodInfo(f *testing.F) {
	f.Add([]byte("a=\"b\"\nc=\"d\\n\"\n"))
	f.Add([]byte("k=\"\\u00e9\\x41\""))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParsePodInfo(data)
		if err != nil {
			return
		}
		// What parses re-formats (as the kubelet would) to the same map.
		var b strings.Builder
		for k, v := range a {
			fmt.Fprintf(&b, "%s=%q\n", k, v)
		}
		again, err := ParsePodInfo([]byte(b.String()))
		if err != nil || len(again) != len(a) {
			t.Fatalf("%q re-formatted does not parse back: %v", a, err)
		}
	})
}

func writePodInfo(t *testing.T, lines map[string]string) string {
	t.Helper()
	var b strings.Builder
	for k, v := range lines {
		fmt.Fprintf(&b, "%s=%q\n", k, v)
	}
	p := filepath.Join(t.TempDir(), "annotations")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Load takes the per-function settings from podinfo and Knative's
// SERVING_* environment; ZIPTRAIL_* variables still override them.
func TestLoadReadsPodInfo(t *testing.T) {
	for _, k := range []string{"ZIPTRAIL_WORKFLOW", "ZIPTRAIL_FUNCTION", "ZIPTRAIL_OPERATOR_ADDR", "ZIPTRAIL_MEMORY_LIMIT",
		"ZIPTRAIL_INLINE_THRESHOLD", "ZIPTRAIL_OBJECT_TTL_SECONDS", "ZIPTRAIL_REDIS_ADDR", "ZIPTRAIL_S3_ENDPOINT"} {
		t.Setenv(k, "")
	}
	t.Setenv("SERVING_NAMESPACE", "team-a")
	t.Setenv("SERVING_POD", "wf-fn-00001-deployment-abc")
	t.Setenv("SERVING_POD_IP", "10.1.2.3")
	t.Setenv("SERVING_SERVICE", "wf-fn")
	t.Setenv("ZIPTRAIL_PODINFO_FILE", writePodInfo(t, map[string]string{
		v1alpha1.AnnotationWorkflow: "wf", v1alpha1.AnnotationFunction: "fn", v1alpha1.AnnotationControlAddr: "ctl.sys.svc:9443",
		v1alpha1.AnnotationMemoryLimit: "1048576", v1alpha1.AnnotationInlineThreshold: "100", v1alpha1.AnnotationObjectTTL: "7m0s",
		"serving.knative.dev/creator": "someone"}))
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.Namespace != "team-a" || c.Pod != "wf-fn-00001-deployment-abc" || c.PodIP != "10.1.2.3" || c.Workflow != "wf" || c.Function != "fn" ||
		c.OperatorAddr != "ctl.sys.svc:9443" || c.MemoryLimit != 1<<20 || c.InlineThreshold != 100 || c.ObjectTTL != 7*time.Minute ||
		c.Redis != nil || c.S3 != nil {
		t.Fatalf("%+v", c)
	}

	t.Setenv("ZIPTRAIL_MEMORY_LIMIT", "2048")
	if c, err := Load(); err != nil || c.MemoryLimit != 2048 || c.ObjectTTL != 7*time.Minute {
		t.Fatalf("env override: %v %+v", err, c)
	}

	// No podinfo file (podinfo not enabled, or outside Knative): defaults.
	t.Setenv("ZIPTRAIL_MEMORY_LIMIT", "")
	t.Setenv("ZIPTRAIL_PODINFO_FILE", filepath.Join(t.TempDir(), "none"))
	if c, err := Load(); err != nil || c.OperatorAddr != "" || c.Function != "wf-fn" || c.MemoryLimit != 256<<20 {
		t.Fatalf("no podinfo: %v %+v", err, c)
	}
}

func TestLoadRefusesBadPodInfo(t *testing.T) {
	for name, lines := range map[string]map[string]string{
		"memory limit": {v1alpha1.AnnotationMemoryLimit: "lots"},
		"zero memory":  {v1alpha1.AnnotationMemoryLimit: "0"},
		"ttl":          {v1alpha1.AnnotationObjectTTL: "-1s"},
		"threshold":    {v1alpha1.AnnotationInlineThreshold: "1e3"},
	} {
		t.Setenv("ZIPTRAIL_PODINFO_FILE", writePodInfo(t, lines))
		if _, err := Load(); err == nil || !strings.Contains(err.Error(), "ziptrail.dev/") {
			t.Errorf("%s: %v", name, err)
		}
	}
	p := filepath.Join(t.TempDir(), "annotations")
	if err := os.WriteFile(p, []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ZIPTRAIL_PODINFO_FILE", p)
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("garbage: %v", err)
	}
	if err := os.WriteFile(p, []byte(strings.Repeat("k=\"v\"\n", MaxPodInfoBytes)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "bytes") {
		t.Errorf("oversized: %v", err)
	}
}

// tokenAuth accepts the token "valid:<ns>:<pod>" as that pod's; the real
// TokenReview is tested in internal/operator/control.
type tokenAuth struct{}

func (tokenAuth) Authenticate(_ context.Context, token string) (control.Caller, error) {
	p := strings.Split(token, ":")
	if len(p) != 3 || p[0] != "valid" {
		return control.Caller{}, status.Error(codes.Unauthenticated, "rejected")
	}
	return control.Caller{Username: "system:serviceaccount:" + p[1] + ":default", Namespace: p[1], ServiceAccount: "default", Pod: p[2], PodUID: "uid"}, nil
}

type noEvents struct{}

func (noEvents) ObjectReady(context.Context, control.Identity, *controlv1.ObjectReady) error {
	return nil
}
func (noEvents) FunctionStarted(context.Context, control.Identity, *controlv1.FunctionStarted) error {
	return nil
}
func (noEvents) FunctionFinished(context.Context, control.Identity, *controlv1.FunctionFinished) error {
	return nil
}

type oneKey struct{}

func (oneKey) Keys(context.Context, string) (*controlv1.Keys, error) {
	return &controlv1.Keys{ActiveKeyId: "k1", Keys: []*controlv1.Key{{Id: "k1", Secret: make([]byte, 32)}}}, nil
}

// A sidecar configured only by podinfo gets its tiers from the operator
// over the authenticated stream, and uses them (a spill lands in the
// Redis the operator named); a sidecar whose token is refused gets none.
func TestTiersComeOverTheControlStream(t *testing.T) {
	rds := servers.StartRedis(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := control.NewServer(noEvents{}, oneKey{})
	srv.Auth = tokenAuth{}
	srv.Tiers = &controlv1.Tiers{RedisAddr: rds.Addr, S3Endpoint: "127.0.0.1:1", S3AccessKey: "ak", S3SecretKey: "sk-secret", S3Bucket: "objs"}
	gs := grpc.NewServer()
	controlv1.RegisterControlServer(gs, srv)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)

	run := func(token string, log func(error)) *Sidecar {
		tok := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tok, []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
		s := New(Config{Namespace: "team-a", Pod: "p1", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(),
			MemoryLimit: 1 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute, OperatorAddr: ln.Addr().String(), TokenFile: tok, Log: log})
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}

	s := run("valid:team-a:p1", nil)
	wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.waitKeys(wctx); err != nil {
		t.Fatal(err)
	}
	// The tiers arrive before the keys.
	r, s3 := s.redis.Load(), s.s3.Load()
	if r == nil || s3 == nil || s3.Bucket != "objs" || s3.Prefix != "team-a/" || r.Prefix != "zt:obj:team-a:" || s.Store.Spill == nil {
		t.Fatalf("tiers not installed: redis %v s3 %+v", r, s3)
	}
	if err := s.Store.Spill(wctx, store.Meta{ID: "s/b/k/1", Expires: time.Now().Add(time.Minute)}, []byte("spilled")); err != nil {
		t.Fatal(err)
	}
	if got, err := rds.Client.Get(wctx, "zt:obj:team-a:s/b/k/1").Result(); err != nil || got != "spilled" {
		t.Fatalf("spill went to the operator's Redis: %q %v", got, err)
	}

	refused := make(chan error, 16)
	bad := run("forged:team-a:p1", func(err error) {
		select {
		case refused <- err:
		default:
		}
	})
	select {
	case err := <-refused:
		if status.Code(err) != codes.Unauthenticated && !strings.Contains(err.Error(), "rejected") {
			t.Fatalf("refusal: %v", err)
		}
	case <-wctx.Done():
		t.Fatal("the forged token's stream was never refused")
	}
	select {
	case <-bad.ready:
		t.Fatal("a refused token got keys")
	default:
	}
	if bad.redis.Load() != nil || bad.s3.Load() != nil {
		t.Fatal("a refused token got the tiers")
	}
}
