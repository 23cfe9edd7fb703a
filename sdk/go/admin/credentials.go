package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/grpc/credentials"
	"k8s.io/client-go/rest"
)

// ErrNoToken means a kubeconfig gives no bearer token, the only
// credential the gateway checks (a client certificate authenticates to the
// API server's TLS, which the gateway does not terminate).
var ErrNoToken = errors.New("no bearer token in the Kubernetes credentials")

// Credentials are what a client of the session gateway (this package's
// Client, the ziptrail CLI) sends: Kubernetes credentials, the way
// client-go sends them to the API server: whatever the kubeconfig's user has that ends up in an
// Authorization header (a token, a token file, an exec or auth-provider
// plugin such as a cloud login), refreshed as client-go refreshes it.
type Credentials struct {
	rt http.RoundTripper // client-go's auth wrappers around a capture
}

// NewCredentials takes the credentials of a REST config (a kubeconfig's
// user, or in-cluster).
func NewCredentials(cfg *rest.Config) (*Credentials, error) {
	rt, err := rest.HTTPWrappersForConfig(cfg, capture{})
	if err != nil {
		return nil, fmt.Errorf("kubernetes credentials: %w", err)
	}
	return &Credentials{rt: rt}, nil
}

// TokenCredentials sends a fixed bearer token.
func TokenCredentials(token string) *Credentials {
	return &Credentials{rt: tokenRT(token)}
}

// Authorization returns the Authorization header value to send now.
func (c *Credentials) Authorization(ctx context.Context) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://gateway/", nil)
	resp, err := c.rt.RoundTrip(req)
	if err != nil {
		return "", fmt.Errorf("kubernetes credentials: %w", err)
	}
	auth := resp.Header.Get("Authorization")
	if scheme, token, ok := strings.Cut(strings.TrimSpace(auth), " "); !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", fmt.Errorf("%w: the kubeconfig's user authenticates otherwise (a client certificate?); "+
			"use a token, e.g. from `kubectl create token <serviceaccount>`, or a kubeconfig user with one", ErrNoToken)
	}
	return auth, nil
}

// capture answers the wrapped request with its Authorization header.
type capture struct{}

func (capture) RoundTrip(r *http.Request) (*http.Response, error) {
	h := http.Header{}
	h.Set("Authorization", r.Header.Get("Authorization"))
	return &http.Response{StatusCode: http.StatusOK, Header: h, Body: http.NoBody, Request: r}, nil
}

type tokenRT string

func (t tokenRT) RoundTrip(r *http.Request) (*http.Response, error) {
	return capture{}.RoundTrip(withHeader(r, "Bearer "+string(t)))
}

func withHeader(r *http.Request, auth string) *http.Request {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", auth)
	return r
}

// Transport sends the credentials with every request through base
// (http.DefaultTransport when nil).
func (c *Credentials) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &authTransport{c: c, base: base}
}

type authTransport struct {
	c    *Credentials
	base http.RoundTripper
}

func (t *authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	auth, err := t.c.Authorization(r.Context())
	if err != nil {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, err
	}
	return t.base.RoundTrip(withHeader(r, auth))
}

// PerRPC returns gRPC per-call credentials. The gateway is typically
// reached inside the cluster without TLS, so they do not require it
// (as HTTP clients send their token too).
func (c *Credentials) PerRPC() credentials.PerRPCCredentials { return perRPC{c} }

type perRPC struct{ c *Credentials }

func (p perRPC) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	auth, err := p.c.Authorization(ctx)
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": auth}, nil
}

func (perRPC) RequireTransportSecurity() bool { return false }
