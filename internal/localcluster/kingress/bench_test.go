package kingress

import (
	"io"
	"net/http"
	"sync"
	"testing"

	"knative.dev/networking/pkg/apis/networking/v1alpha1"
)

var (
	benchOnce    sync.Once
	benchBackend *backend
)

// benchSetup routes bench.example.com to a small echo backend, once.
func benchSetup(b *testing.B) *backend {
	benchOnce.Do(func() {
		ns := namespace(b)
		benchBackend = startBackend(b, "bench", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte("ok"))
		}))
		publish(b, ns, "svc", true, benchBackend.addr)
		createIngress(b, ns, "bench", rule(v1alpha1.IngressVisibilityExternalIP, []string{"bench.example.com"}, path("", splitTo(ns, "svc", 100, nil))))
		waitReady(b, ns, "bench")
	})
	return benchBackend
}

func benchGet(b *testing.B, url, host string) {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Host = host
		for pb.Next() {
			resp, err := c.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}

// BenchmarkProxy is a small GET through the external listener; compare
// with BenchmarkDirect for the proxy's overhead per request.
func BenchmarkProxy(b *testing.B) {
	benchSetup(b)
	benchGet(b, "http://"+extAddr+"/", "bench.example.com")
}

// BenchmarkDirect is the same GET sent straight to the backend.
func BenchmarkDirect(b *testing.B) {
	be := benchSetup(b)
	benchGet(b, "http://"+be.addr.String()+"/", "bench.example.com")
}

// BenchmarkProxySerial and BenchmarkDirectSerial measure latency, one
// request at a time.
func BenchmarkProxySerial(b *testing.B) {
	benchSetup(b)
	b.SetParallelism(1)
	serialGet(b, "http://"+extAddr+"/")
}

func BenchmarkDirectSerial(b *testing.B) {
	be := benchSetup(b)
	serialGet(b, "http://"+be.addr.String()+"/")
}

func serialGet(b *testing.B, url string) {
	c := &http.Client{}
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Host = "bench.example.com"
	b.ReportAllocs()
	for b.Loop() {
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
