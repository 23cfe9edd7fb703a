package localserving_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/apis"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/internal/controlplane"
	"github.com/ziptrail/ziptrail/internal/localserving"
	"github.com/ziptrail/ziptrail/internal/netns"
	"github.com/ziptrail/ziptrail/internal/nodeagent/catalog"
)

// echo is a tiny function: it answers with its pod's identity.
const echo = `
import http.server, os, socket
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (os.environ["GREETING"] + os.environ["SUFFIX"] + " from " + socket.gethostbyname(socket.gethostname()) + " " + str(os.getpid())).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["PORT"])), H).serve_forever()
`

// TestRuntime runs Knative Services as local pods with a real API server, a
// real Knative queue-proxy and real network namespaces.
func TestRuntime(t *testing.T) {
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()

	// The stock Knative queue-proxy: the runtime must work with it unchanged.
	queue := filepath.Join(dir, "queue")
	if out, err := exec.Command("go", "build", "-o", queue, "knative.dev/serving/cmd/queue").CombinedOutput(); err != nil {
		t.Fatalf("build queue-proxy: %v\n%s", err, out)
	}
	env, err := controlplane.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	k8s, err := client.New(env.Config, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	network, err := netns.New("ztls", netip.MustParsePrefix("10.215.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if err := network.Setup(ctx); err != nil {
		t.Fatalf("network setup (needs root or CAP_NET_ADMIN): %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	shm, err := os.MkdirTemp("/dev/shm", "ziptrail-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(shm)
	// The image catalog says how an image runs: python3 for this one, with
	// an env the container's env overrides.
	catalogFile := filepath.Join(dir, "images.yaml")
	if err := os.WriteFile(catalogFile, []byte(`
images:
  - image: example.dev/python:3
    entrypoint: [python3]
    env: [{name: GREETING, value: from-the-image}, {name: SUFFIX, value: "!"}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	images, err := catalog.Load(catalogFile, filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := localserving.New(localserving.Options{
		Network: network, QueueProxy: queue, IngressPort: port, Instances: 2, Catalog: images,
		StateDir: dir, ShmRoot: shm, ReadyTimeout: 30 * time.Second, TerminationGrace: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := rt.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	srv := &http.Server{Handler: localserving.NewRouter(rt)}
	go srv.Serve(ln)
	defer srv.Close()

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: controlplane.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&localserving.Reconciler{Client: mgr.GetClient(), Runtime: rt}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	go mgr.Start(ctx)

	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fns"}}); err != nil {
		t.Fatal(err)
	}
	// The image's entrypoint (python3) runs the container's args.
	svc := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "fns"}}
	svc.Spec.Template.Spec.Containers = []corev1.Container{{Image: "example.dev/python:3", Args: []string{"-c", echo},
		Env: []corev1.EnvVar{{Name: "GREETING", Value: "hi"}}}}
	if err := k8s.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	// An image the catalog does not list fails the Service, naming the file.
	missing := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Name: "missing", Namespace: "fns"}}
	missing.Spec.Template.Spec.Containers = []corev1.Container{{Image: "example.dev/nowhere:1"}}
	if err := k8s.Create(ctx, missing); err != nil {
		t.Fatal(err)
	}

	url := waitReady(t, k8s, "fns", "hello")
	if want := fmt.Sprintf("http://hello.fns.ziptrail.local:%d", port); url != want {
		t.Errorf("status URL = %s, want %s", url, want)
	}
	pods := rt.Pods("fns", "hello")
	if len(pods) != 2 {
		t.Fatalf("pods = %v, want 2", pods)
	}
	// The container's env wins over the image's; the image's shows through.
	if body := get(t, port, "hello.fns.ziptrail.local"); !strings.HasPrefix(body, "hi! from ") {
		t.Errorf("env: %q, want the container's GREETING and the image's SUFFIX", body)
	}
	waitFor(t, "the missing image's Service to fail", func() bool {
		s := &servingv1.Service{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: "fns", Name: "missing"}, s); err != nil {
			return false
		}
		c := s.Status.GetCondition(apis.ConditionReady)
		return c != nil && c.IsFalse() && strings.Contains(c.Message, "ErrImagePull") &&
			strings.Contains(c.Message, `"example.dev/nowhere:1"`) && strings.Contains(c.Message, catalogFile)
	})
	// Requests are spread over both pods.
	seen := map[string]bool{}
	for i := 0; i < 8; i++ {
		seen[get(t, port, "hello.fns.ziptrail.local")] = true
	}
	if len(seen) != 2 {
		t.Errorf("round robin reached %d distinct pods (%v), want 2", len(seen), seen)
	}

	// A crashed function process is replaced by a new pod.
	if err := rt.KillUserProcess(pods[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the crashed pod to be replaced", func() bool {
		now := rt.Pods("fns", "hello")
		return len(now) == 2 && now[0] != pods[0] && now[1] != pods[0]
	})
	if body := get(t, port, "hello.fns.ziptrail.local"); len(body) < 2 || body[:2] != "hi" {
		t.Errorf("after replacement: %q", body)
	}

	// A spec change rolls out a new generation.
	if err := retryUpdate(ctx, k8s, "fns", "hello", func(s *servingv1.Service) {
		s.Spec.Template.Spec.Containers[0].Env[0].Value = "hello"
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new generation to serve", func() bool {
		b, err := tryGet(port, "hello.fns.ziptrail.local")
		return err == nil && len(b) > 5 && b[:5] == "hello"
	})

	// Unknown hosts and services without pods get clear errors.
	if code := status(t, port, "nope.fns.ziptrail.local"); code != http.StatusServiceUnavailable {
		t.Errorf("unknown service: status %d, want 503", code)
	}
	if code := status(t, port, "example.com"); code != http.StatusNotFound {
		t.Errorf("foreign host: status %d, want 404", code)
	}

	// Deleting the Service stops its pods and removes their namespaces.
	if err := k8s.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pods to stop", func() bool { return len(rt.Pods("fns", "hello")) == 0 })
	waitFor(t, "namespaces to go", func() bool {
		out, _ := exec.Command("ip", "netns", "list").Output()
		return !strings.Contains(string(out), "ztls-hello")
	})
}

func waitReady(t *testing.T, k8s client.Client, ns, name string) string {
	t.Helper()
	var url string
	waitFor(t, "service "+name+" ready", func() bool {
		s := &servingv1.Service{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
			return false
		}
		if s.IsReady() && s.Status.URL != nil {
			url = s.Status.URL.String()
			return true
		}
		return false
	})
	return url
}

func retryUpdate(ctx context.Context, k8s client.Client, ns, name string, mutate func(*servingv1.Service)) error {
	for i := 0; i < 10; i++ {
		s := &servingv1.Service{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
			return err
		}
		mutate(s)
		err := k8s.Update(ctx, s)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
	return fmt.Errorf("update %s/%s: too many conflicts", ns, name)
}

func tryGet(port int, host string) (string, error) {
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	req.Host = host
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return string(b), err
}

func get(t *testing.T, port int, host string) string {
	t.Helper()
	b, err := tryGet(port, host)
	if err != nil {
		t.Fatalf("GET via ingress %s: %v", host, err)
	}
	return b
}

func status(t *testing.T, port int, host string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitFor polls cond (bounded at 60 s) for asynchronous convergence.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
