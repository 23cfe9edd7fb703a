package netns

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		prefix, subnet, err string
	}{
		{"zt", "10.213.0.0/16", ""},
		{"", "10.213.0.0/16", "prefix"},
		{"toolong", "10.213.0.0/16", "prefix"},
		{"zt", "10.213.0.0/30", "/24 or larger"},
		{"zt", "fd00::/64", "IPv4"},
	} {
		_, err := New(tc.prefix, netip.MustParsePrefix(tc.subnet))
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("New(%q, %s) = %v, want error containing %q", tc.prefix, tc.subnet, err, tc.err)
		}
	}
}

// TestPodsReachEachOther creates two real namespaces and serves HTTP from
// one pod to the other and to the host over the bridge.
func TestPodsReachEachOther(t *testing.T) {
	ctx := context.Background()
	n, err := New("ztt", netip.MustParsePrefix("10.214.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Setup(ctx); err != nil {
		t.Fatalf("setup (needs root or CAP_NET_ADMIN): %v", err)
	}
	t.Cleanup(func() {
		if err := n.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	a, err := n.AddPod(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.AddPod(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if a.IP == b.IP {
		t.Fatalf("pods share the address %s", a.IP)
	}

	// A server on the same port in both pods: only possible with separate namespaces.
	for _, p := range []*Pod{a, b} {
		srv := p.Command(ctx, "python3", "-c", fmt.Sprintf(`
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"%s")
    def log_message(self, *a): pass
http.server.HTTPServer(("0.0.0.0", 8022), H).serve_forever()`, p.Name))
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	}
	for _, p := range []*Pod{a, b} {
		body := getWithRetry(t, fmt.Sprintf("http://%s/", net.JoinHostPort(p.IP.String(), "8022")))
		if body != p.Name {
			t.Errorf("host -> %s: got %q", p.Name, body)
		}
	}
	// Pod a reaches pod b through the bridge.
	out, err := a.Command(ctx, "python3", "-c", fmt.Sprintf(
		`import urllib.request; print(urllib.request.urlopen("http://%s:8022/", timeout=5).read().decode())`, b.IP)).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != b.Name {
		t.Errorf("pod a -> pod b: %v %q", err, out)
	}

	if err := n.DeletePod(ctx, a); err != nil {
		t.Errorf("delete pod: %v", err)
	}
	if err := exec.Command("ip", "netns", "exec", a.Name, "true").Run(); err == nil {
		t.Errorf("namespace %s still exists after DeletePod", a.Name)
	}
}

// getWithRetry waits (bounded) for a just-started server to listen.
func getWithRetry(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := client.Get(url)
		if err == nil {
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A freed address is reused only once the fresh ones run out, and then the
// longest-free first, so a replacement pod never takes the address of the
// pod it replaces while consumers may still hold references to it.
func TestAllocateReusesAddressesLast(t *testing.T) {
	n, err := New("zt", netip.MustParsePrefix("10.9.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := n.allocate()
	b, _ := n.allocate()
	n.free = append(n.free, a, b) // both pods deleted, a first
	var got []netip.Addr
	for {
		ip, err := n.allocate()
		if err != nil {
			break
		}
		got = append(got, ip)
	}
	if len(got) != 253 || got[0].String() != "10.9.0.4" || got[250].String() != "10.9.0.254" || got[251] != a || got[252] != b {
		t.Fatalf("allocation order: %d addresses, first %v, last three %v", len(got), got[0], got[len(got)-3:])
	}
}
