package servers

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
)

// Functions serves workflow functions (Knative Service name -> handler)
// from real HTTP servers on loopback, and resolves Services to them the
// way the dispatcher's Knative resolver would.
type Functions struct {
	mu   sync.Mutex
	urls map[string]string
}

// URL implements the dispatcher's resolver.
func (f *Functions) URL(_ context.Context, _, svc string) (*url.URL, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	u, ok := f.urls[svc]
	if !ok {
		return nil, fmt.Errorf("no function %s", svc)
	}
	return url.Parse(u)
}

// Add serves svc with h until the test ends.
func (f *Functions) Add(t TB, svc string, h http.Handler) {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.urls == nil {
		f.urls = map[string]string{}
	}
	f.urls[svc] = srv.URL
}
