package activatorext

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// FuzzZiptrailHeaders sends whatever a client puts in the ziptrail headers
// through activator-ext's layer as a request through the activator meets
// it: the handler parses the headers and keeps the references alive at
// their producers (a real producer and the namespace's real keys), and the
// locality throttler picks a pod by the producer-node header. Nothing may
// panic, every request is answered, and no forged reference extends an
// object. Seeds: real references, forged ones, the header of issue 31.
func FuzzZiptrailHeaders(f *testing.F) {
	p := startProducer(f)
	sec := &secrets{}
	sec.set(testNS, p.keys, "k1")
	dp := &DataPlaneExtender{Keys: sec.get, MinReread: time.Millisecond}
	f.Cleanup(dp.Close)
	real := p.put(f, "real", time.Now().Add(time.Hour))
	for _, s := range []struct{ refs, node string }{
		{real, "node-2"},
		{"zt1.AXg", ""},
		{forgedRef() + "," + real + ",,", "node-1"},
		{"zt1.", "\x00"},
		{strings.Repeat("zt1.AAAA,", 300), strings.Repeat("n", 300)},
		{"zt2." + real[4:], "node-3"},
	} {
		f.Add(s.refs, s.node)
	}
	m, count := testMetrics(f)
	locality := &LocalityThrottler{Next: knative{dest: "10.0.1.5:8012"}, Pods: index(privateEndpoints(), nil), Metrics: m}
	keepAlive := &Periodic{Extend: dp.Extend, Interval: time.Millisecond, Metrics: m}
	h := &Handler{KeepAlive: keepAlive, Metrics: m, Namespace: func(*http.Request) string { return testNS },
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			err := locality.Try(r.Context(), rev, func(dest string, _ bool) error {
				w.Header().Set("X-Dest", dest)
				return nil
			})
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
			}
		})}
	f.Fuzz(func(t *testing.T, refs, node string) {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
		r.Header[HeaderRefs] = []string{refs}
		r.Header[HeaderProducerNode] = []string{node}
		ctx, cancel := context.WithTimeout(r.Context(), 50*time.Millisecond)
		defer cancel()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r.WithContext(ctx))
		if w.Code != http.StatusOK || w.Header().Get("X-Dest") == "" {
			t.Fatalf("refs %q node %q: answered %d, dest %q", refs, node, w.Code, w.Header().Get("X-Dest"))
		}
		if n := count("ziptrail.activator.panics", "", ""); n != 0 {
			t.Fatalf("refs %q node %q: %d panics recovered", refs, node, n)
		}
	})
}
