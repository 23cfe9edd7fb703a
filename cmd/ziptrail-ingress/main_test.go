package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestBinary runs ziptrail-ingress against a real API server: /healthz and
// /readyz answer on the admin port, an unknown host gets 404 on the gateway,
// a bad kubeconfig is a clear error, and SIGTERM exits 0.
func TestBinary(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `eval \"$(hack/install-deps.sh --env)\"` first")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "ziptrail-ingress")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v: %s", err, out)
	}
	modDir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "knative.dev/networking").Output()
	if err != nil {
		t.Fatal(err)
	}
	te := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join(strings.TrimSpace(string(modDir)), "config", "ingress.yaml")}, ErrorIfCRDPathMissing: true}
	if _, err := te.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = te.Stop() }()
	user, err := te.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}

	// A kubeconfig that does not exist is an error naming the flag.
	out, err := exec.Command(bin, "--kubeconfig", filepath.Join(dir, "missing")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--kubeconfig") {
		t.Errorf("missing kubeconfig: %v %q", err, out)
	}

	ports := freePorts(t, 3)
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig,
		"--http-address", "127.0.0.1:"+ports[0], "--cluster-local-address", "127.0.0.1:"+ports[1], "--admin-address", "127.0.0.1:"+ports[2])
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			if !once && strings.Contains(sc.Text(), "kingress serving") {
				once = true
				close(serving)
			}
		}
	}()
	select {
	case <-serving:
	case <-time.After(60 * time.Second): // only keeps a broken binary from hanging the test
		_ = cmd.Process.Kill()
		t.Fatal("no \"kingress serving\" log line")
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := httpGet(t, "http://127.0.0.1:"+ports[2]+p, ""); code != http.StatusOK {
			t.Errorf("%s: %d %q", p, code, body)
		}
	}
	if code, body := httpGet(t, "http://127.0.0.1:"+ports[0]+"/", "nowhere.example.com"); code != http.StatusNotFound || !strings.Contains(body, "nowhere.example.com") {
		t.Errorf("unknown host: %d %q", code, body)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

func freePorts(t *testing.T, n int) []string {
	var out []string
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, fmt.Sprint(l.Addr().(*net.TCPAddr).Port))
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

func httpGet(t *testing.T, url, host string) (int, string) {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
