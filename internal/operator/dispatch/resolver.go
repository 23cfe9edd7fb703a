package dispatch

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"time"

	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ServiceResolver reads a Knative Service's URL from its status: the
// cluster-local address when Knative publishes one (the operator runs in the
// cluster), else the public URL.
type ServiceResolver struct {
	Reader client.Reader
}

// URL implements Resolver.
func (r ServiceResolver) URL(ctx context.Context, namespace, service string) (*url.URL, error) {
	svc := &servingv1.Service{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: service}, svc); err != nil {
		return nil, err
	}
	if a := svc.Status.Address; a != nil && a.URL != nil {
		return a.URL.URL(), nil
	}
	if svc.Status.URL != nil {
		return svc.Status.URL.URL(), nil
	}
	return nil, fmt.Errorf("knative service %s/%s has no URL yet (not ready)", namespace, service)
}

// DefaultURLTTL is how long CachedResolver keeps a URL it found.
const DefaultURLTTL = 5 * time.Second

// CachedResolver keeps the URLs another Resolver found for TTL, so that
// the dispatcher does not read a Knative Service (a cached Get is a deep
// copy of the whole object, its managed fields included: 8 % of the
// operator's CPU in a 1,000-step chain, docs/bench/history/chain.md, "The
// Knative floor") for every invocation. A Service's address is derived
// from its name and namespace and does not change while it exists; a
// failed lookup (not ready yet, not found) is never kept. The returned URL
// is the caller's (a copy).
type CachedResolver struct {
	Resolver Resolver
	TTL      time.Duration    // default DefaultURLTTL
	Now      func() time.Time // default time.Now

	mu   sync.Mutex
	urls map[string]cachedURL
}

type cachedURL struct {
	u       url.URL
	expires time.Time
}

// maxCachedURLs bounds the cache; past it, expired entries are dropped.
const maxCachedURLs = 4096

// URL implements Resolver.
func (c *CachedResolver) URL(ctx context.Context, namespace, service string) (*url.URL, error) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	key := namespace + "/" + service
	t := now()
	c.mu.Lock()
	e, ok := c.urls[key]
	c.mu.Unlock()
	if ok && t.Before(e.expires) {
		u := e.u
		return &u, nil
	}
	u, err := c.Resolver.URL(ctx, namespace, service)
	if err != nil {
		return nil, err
	}
	ttl := c.TTL
	if ttl <= 0 {
		ttl = DefaultURLTTL
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.urls == nil {
		c.urls = map[string]cachedURL{}
	}
	if len(c.urls) >= maxCachedURLs {
		for k, v := range c.urls {
			if !t.Before(v.expires) {
				delete(c.urls, k)
			}
		}
		if len(c.urls) >= maxCachedURLs {
			clear(c.urls)
		}
	}
	c.urls[key] = cachedURL{u: *u, expires: t.Add(ttl)}
	out := *u
	return &out, nil
}
