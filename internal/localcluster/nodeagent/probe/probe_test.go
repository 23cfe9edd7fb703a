package probe

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func serverTarget(t *testing.T, h http.HandlerFunc) (Target, int32) {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	host, port, _ := net.SplitHostPort(u.Host)
	p, _ := strconv.Atoi(port)
	return Target{PodIP: host, Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(p)}}}, int32(p)
}

// HTTP probes send the kubelet's User-Agent and the probe's headers
// (including Host), resolve named ports, and count 2xx/3xx as success.
func TestHTTPProbe(t *testing.T) {
	var got http.Header
	var host string
	status := http.StatusOK
	target, _ := serverTarget(t, func(w http.ResponseWriter, r *http.Request) {
		got, host = r.Header.Clone(), r.Host
		w.WriteHeader(status)
	})
	h := Handler{HTTPGet: &corev1.HTTPGetAction{Path: "healthz", Port: intstr.FromString("http"),
		HTTPHeaders: []corev1.HTTPHeader{{Name: "K-Network-Probe", Value: "queue"}, {Name: "Host", Value: "svc.example"}}}}
	if err := Run(context.Background(), h, target); err != nil {
		t.Fatal(err)
	}
	if got.Get("User-Agent") != "kube-probe/1.36" || got.Get("K-Network-Probe") != "queue" || host != "svc.example" {
		t.Errorf("headers %v host %q", got, host)
	}
	status = http.StatusServiceUnavailable
	if err := Run(context.Background(), h, target); err == nil {
		t.Error("503 must fail")
	}
	h.HTTPGet.Port = intstr.FromString("nope")
	if err := Run(context.Background(), h, target); err == nil {
		t.Error("an unknown named port must fail")
	}
}

func TestTCPProbe(t *testing.T) {
	target, port := serverTarget(t, func(http.ResponseWriter, *http.Request) {})
	if err := Run(context.Background(), Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}}, target); err != nil {
		t.Fatal(err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := l.Addr().(*net.TCPAddr).Port
	l.Close()
	if err := Run(context.Background(), Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(closed)}}, target); err == nil {
		t.Fatal("a closed port must fail")
	}
}

// Thresholds: readiness turns true after successThreshold successes and
// false after failureThreshold failures; Failed marks the threshold.
func TestWorkerThresholds(t *testing.T) {
	var mu sync.Mutex
	ok := true
	target, _ := serverTarget(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	results := make(chan Result, 100)
	w := &Worker{Probe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("http")}},
		PeriodSeconds: 1, SuccessThreshold: 2, FailureThreshold: 2}, Target: target, Report: func(r Result) { results <- r }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	next := func() Result {
		select {
		case r := <-results:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no probe result")
			return Result{}
		}
	}
	if r := next(); r.Success || r.Changed {
		t.Fatalf("one success of two: %+v", r)
	}
	if r := next(); !r.Success || !r.Changed {
		t.Fatalf("second success: %+v", r)
	}
	mu.Lock()
	ok = false
	mu.Unlock()
	if r := next(); !r.Success || r.Failed {
		t.Fatalf("one failure of two: %+v", r)
	}
	if r := next(); r.Success || !r.Changed || !r.Failed {
		t.Fatalf("second failure: %+v", r)
	}
}
