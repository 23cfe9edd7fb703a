package kingress

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"knative.dev/networking/pkg/apis/networking/v1alpha1"
)

// rawExchange writes req on a fresh connection to addr and returns the
// status line of the answer. The deadline only keeps a broken proxy from
// hanging the test.
func rawExchange(t *testing.T, addr string, req []byte) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	go func() { _, _ = c.Write(req) }()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// TestMalformedRequests sends garbage, oversized headers, a bad Host and an
// absurd path straight to both listeners: each gets a 4xx and the proxy
// keeps serving.
func TestMalformedRequests(t *testing.T) {
	ns := namespace(t)
	a := newBackend(t, "a", nil)
	publish(t, ns, "svc-a", true, a.addr)
	createIngress(t, ns, "bad", rule(v1alpha1.IngressVisibilityExternalIP, []string{"bad.example.com"}, path("", splitTo(ns, "svc-a", 100, nil))))
	waitReady(t, ns, "bad")
	huge := strings.Repeat("x", 2<<20)
	cases := map[string]struct {
		req  string
		want string
	}{
		"garbage":                 {"\x00\x01\x02 not http\r\n\r\n", "HTTP/1.1 400"},
		"oversized header":        {"GET / HTTP/1.1\r\nHost: bad.example.com\r\nX-Big: " + huge + "\r\n\r\n", "HTTP/1.1 431"},
		"bad host":                {"GET / HTTP/1.1\r\nHost: bad host\r\n\r\n", "HTTP/1.1 400"},
		"no host":                 {"GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		"huge path":               {"GET /" + strings.Repeat("a", 1<<20) + " HTTP/1.1\r\nHost: bad.example.com\r\n\r\n", "HTTP/1.1 431"},
		"bad chunking":            {"POST / HTTP/1.1\r\nHost: bad.example.com\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "HTTP/1.1 400"},
		"absolute URI other host": {"GET http://evil.example.com/ HTTP/1.1\r\nHost: bad.example.com\r\n\r\n", "HTTP/1.1 404"},
	}
	for name, tc := range cases {
		for _, addr := range []string{extAddr, locAddr} {
			if got := rawExchange(t, addr, []byte(tc.req)); !strings.HasPrefix(got, tc.want) {
				t.Errorf("%s on %s: %q, want %s", name, addr, got, tc.want)
			}
		}
	}
	if code, e, body := get(t, extAddr, "bad.example.com", "/", nil); code != http.StatusOK || e.Name != "a" {
		t.Fatalf("after malformed requests: %d %q", code, body)
	}
}

// TestRetryOnRefused: a Service with a dead endpoint (nothing listens)
// and a live one answers every request.
func TestRetryOnRefused(t *testing.T) {
	ns := namespace(t)
	a := newBackend(t, "a", nil)
	dead, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().(*net.TCPAddr)
	dead.Close()
	// Same port number on both endpoints is what an EndpointSlice holds, so
	// the live backend listens on a second address: give the dead endpoint
	// the live port on another IP? No: use two slices, one per port.
	publish(t, ns, "svc-a", true, a.addr)
	deadSlice(t, ns, "svc-a", deadAddr)
	createIngress(t, ns, "retry", rule(v1alpha1.IngressVisibilityExternalIP, []string{"retry.example.com"}, path("", splitTo(ns, "svc-a", 100, nil))))
	waitReady(t, ns, "retry")
	for i := range 20 {
		req, _ := http.NewRequest(http.MethodPost, "http://"+extAddr+"/", strings.NewReader(fmt.Sprintf("body %d", i)))
		req.Host = "retry.example.com"
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d, want the refused endpoint skipped", i, resp.StatusCode)
		}
	}
}

// deadSlice adds a second EndpointSlice to the Service with one ready
// endpoint nobody listens on.
func deadSlice(t *testing.T, ns, svc string, addr *net.TCPAddr) {
	t.Helper()
	port, name, ready := int32(addr.Port), "http", true
	s := endpointSlice(ns, svc+"-dead", svc, name, port, addr.IP.String(), ready)
	if _, err := kube.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestUpgradeAndStreaming: a websocket-style upgrade passes through both
// ways, and a streamed response reaches the client chunk by chunk (the
// backend sends its second chunk only after the client got the first).
func TestUpgradeAndStreaming(t *testing.T) {
	ns := namespace(t)
	release := make(chan struct{})
	a := newBackend(t, "a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "websocket" {
			c, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			_ = rw.Flush()
			_, _ = io.Copy(c, rw) // echo
			return
		}
		_, _ = w.Write([]byte("first\n"))
		_ = http.NewResponseController(w).Flush()
		<-release
		_, _ = w.Write([]byte("second\n"))
	}))
	publish(t, ns, "svc-a", true, a.addr)
	createIngress(t, ns, "ws", rule(v1alpha1.IngressVisibilityExternalIP, []string{"ws.example.com"}, path("", splitTo(ns, "svc-a", 100, nil))))
	waitReady(t, ns, "ws")

	c, err := net.Dial("tcp", extAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	_, _ = c.Write([]byte("GET /chat HTTP/1.1\r\nHost: ws.example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	for _, msg := range []string{"ping\n", "second message\n"} {
		_, _ = c.Write([]byte(msg))
		got, err := br.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echo over the upgraded connection: %q %v, want %q", got, err, msg)
		}
	}

	req, _ := http.NewRequest(http.MethodGet, "http://"+extAddr+"/stream", nil)
	req.Host = "ws.example.com"
	sresp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	sr := bufio.NewReader(sresp.Body)
	if line, err := sr.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("first chunk: %q %v", line, err)
	}
	close(release)
	if line, err := sr.ReadString('\n'); err != nil || line != "second\n" {
		t.Fatalf("second chunk: %q %v", line, err)
	}
}

// TestH2CAndLargeBodies: a client speaking cleartext HTTP/2 reaches an h2c
// backend (Service port named http2) over HTTP/2, and a 32 MiB upload
// arrives intact (checksummed by the backend) through an HTTP/1.1 backend.
func TestH2CAndLargeBodies(t *testing.T) {
	ns := namespace(t)
	sum := func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, _ := io.Copy(h, r.Body)
		fmt.Fprintf(w, "%s %d %s", r.Proto, n, hex.EncodeToString(h.Sum(nil)))
	}
	h1 := newBackend(t, "h1", http.HandlerFunc(sum))
	h2srv := &http.Server{Handler: http.HandlerFunc(sum), Protocols: new(http.Protocols), ReadHeaderTimeout: 10 * time.Second}
	h2srv.Protocols.SetUnencryptedHTTP2(true)
	l, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = h2srv.Serve(l) }()
	t.Cleanup(func() { _ = h2srv.Close() })
	publish(t, ns, "svc-h1", true, h1.addr)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "svc-h2"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http2", Port: 80, TargetPort: intstr.FromInt32(8013)}}},
	}
	if _, err := kube.CoreV1().Services(ns).Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	la := l.Addr().(*net.TCPAddr)
	if _, err := kube.DiscoveryV1().EndpointSlices(ns).Create(context.Background(),
		endpointSlice(ns, "svc-h2-1", "svc-h2", "http2", int32(la.Port), la.IP.String(), true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createIngress(t, ns, "h2", rule(v1alpha1.IngressVisibilityExternalIP, []string{"h2.example.com"},
		path("/h2", splitTo(ns, "svc-h2", 100, nil)), path("/", splitTo(ns, "svc-h1", 100, nil))))
	// The h2c backend does not answer probes (no probe handler): the
	// prober takes a plain 200 as best-effort success, as Knative's does.
	waitReady(t, ns, "h2")

	h2c := &http.Transport{Protocols: new(http.Protocols)}
	h2c.Protocols.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: h2c}
	body := strings.Repeat("0123456789abcdef", 2<<20) // 32 MiB
	want := sha256.Sum256([]byte(body))
	for _, tc := range []struct {
		client *http.Client
		path   string
		proto  string
	}{{hc, "/h2", "HTTP/2.0"}, {client, "/", "HTTP/1.1"}, {hc, "/", "HTTP/1.1"}} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+extAddr+tc.path, strings.NewReader(body))
		req.Host = "h2.example.com"
		resp, err := tc.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if exp := fmt.Sprintf("%s %d %s", tc.proto, len(body), hex.EncodeToString(want[:])); string(got) != exp {
			t.Errorf("POST %s: %d %q, want %q", tc.path, resp.StatusCode, got, exp)
		}
	}
}
