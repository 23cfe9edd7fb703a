package control

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Audience is the token audience the control service accepts (Knative
// mounts queue-proxy's token for it, see controlv1.DefaultTokenFile).
const Audience = controlv1.Audience

// The claims a bound service-account token carries in TokenReview's
// status.user.extra: the pod the kubelet requested it for, and the node
// that pod was scheduled to when the token was issued (Kubernetes >= 1.30,
// ServiceAccountTokenPodNodeInfo, GA in 1.33; absent for a pod not yet
// scheduled and on older API servers).
const (
	ExtraPodName  = "authentication.kubernetes.io/pod-name"
	ExtraPodUID   = "authentication.kubernetes.io/pod-uid"
	ExtraNodeName = "authentication.kubernetes.io/node-name"
	ExtraNodeUID  = "authentication.kubernetes.io/node-uid"
)

// Caller is who a verified token says is calling.
type Caller struct {
	// Username is the token's user, system:serviceaccount:<ns>:<sa> for
	// service-account tokens.
	Username string
	// Namespace and ServiceAccount are parsed from Username; empty for a
	// user that is not a service account.
	Namespace, ServiceAccount string
	// Pod and PodUID are the pod the token is bound to (the kubelet binds
	// every projected token to its pod); empty for unbound tokens.
	Pod, PodUID string
	// Node and NodeUID are the node of that pod, as the API server signed
	// it into the token (the kubelet requests the token after the pod is
	// bound to its node); empty when the token carries no node.
	Node, NodeUID string
	// Expires is the token's expiry (its exp claim); zero when unknown.
	Expires time.Time
}

func (c Caller) String() string {
	if c.Pod != "" {
		return fmt.Sprintf("pod %s/%s (%s)", c.Namespace, c.Pod, c.Username)
	}
	return c.Username
}

// Authenticator verifies the bearer token a caller of the control service
// presents. Errors are gRPC status errors: Unauthenticated for a token
// that is not valid (forged, expired, revoked, wrong audience),
// Unavailable when it cannot be checked now.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (Caller, error)
}

// TokenReviewer authenticates tokens with the Kubernetes API server's
// TokenReview for Audience, and caches answers briefly: a valid token for
// at most TTL and never past its expiry, a rejected one for DenyTTL (so a
// caller retrying a bad token costs the API server one review per DenyTTL).
// The cache is keyed by the token's SHA-256 and bounded by MaxEntries.
type TokenReviewer struct {
	// Client creates TokenReviews (create on tokenreviews,
	// authentication.k8s.io).
	Client client.Client
	// Audience the tokens must carry; default Audience.
	Audience string
	// TTL bounds how long a valid token's review is reused (default 1m);
	// DenyTTL how long a rejection is (default 2s).
	TTL, DenyTTL time.Duration
	// MaxEntries bounds the cache (default 4096).
	MaxEntries int
	Now        func() time.Time

	mu    sync.Mutex
	cache map[[32]byte]review
}

type review struct {
	caller  Caller
	err     error
	expires time.Time
}

// Authenticate implements Authenticator.
func (r *TokenReviewer) Authenticate(ctx context.Context, token string) (Caller, error) {
	key := sha256.Sum256([]byte(token))
	now := r.now()
	r.mu.Lock()
	c, ok := r.cache[key]
	r.mu.Unlock()
	if ok && now.Before(c.expires) {
		tokenReviews.WithLabelValues("cached").Inc()
		return c.caller, c.err
	}
	aud := r.Audience
	if aud == "" {
		aud = Audience
	}
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{aud}}}
	if err := r.Client.Create(ctx, tr); err != nil {
		tokenReviews.WithLabelValues("error").Inc()
		// Not cached: the next call asks again.
		return Caller{}, status.Errorf(codes.Unavailable, "cannot verify the token with the Kubernetes API server (TokenReview): %v", err)
	}
	var (
		caller Caller
		err    error
	)
	switch {
	case !tr.Status.Authenticated:
		why := tr.Status.Error
		if why == "" {
			why = "invalid or expired"
		}
		err = status.Errorf(codes.Unauthenticated, "the Kubernetes API server rejected the token for audience %q: %s", aud, why)
	case !audienceIn(aud, tr.Status.Audiences):
		err = status.Errorf(codes.Unauthenticated, "the token is not for audience %q (TokenReview answered audiences %v)", aud, tr.Status.Audiences)
	default:
		caller = callerOf(tr.Status.User, token)
	}
	if err != nil {
		tokenReviews.WithLabelValues("rejected").Inc()
	} else {
		tokenReviews.WithLabelValues("authenticated").Inc()
	}
	expires := now.Add(orDefault(r.DenyTTL, 2*time.Second))
	if err == nil {
		expires = now.Add(orDefault(r.TTL, time.Minute))
		if !caller.Expires.IsZero() && caller.Expires.Before(expires) {
			expires = caller.Expires
		}
	}
	r.mu.Lock()
	if r.cache == nil {
		r.cache = map[[32]byte]review{}
	}
	r.trim(now)
	r.cache[key] = review{caller: caller, err: err, expires: expires}
	r.mu.Unlock()
	return caller, err
}

func (r *TokenReviewer) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// trim makes room for one entry: expired entries go first, then arbitrary
// ones, so the cache never grows past MaxEntries.
func (r *TokenReviewer) trim(now time.Time) {
	max := r.MaxEntries
	if max <= 0 {
		max = 4096
	}
	if len(r.cache) < max {
		return
	}
	for k, c := range r.cache {
		if !now.Before(c.expires) {
			delete(r.cache, k)
		}
	}
	for k := range r.cache {
		if len(r.cache) < max {
			return
		}
		delete(r.cache, k)
	}
}

func orDefault(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

func audienceIn(aud string, auds []string) bool {
	// An API server that does not report audiences checked the requested
	// ones (TokenReview fails the review when none matches).
	if len(auds) == 0 {
		return true
	}
	for _, a := range auds {
		if a == aud {
			return true
		}
	}
	return false
}

// callerOf reads the caller out of a successful review. The token's
// expiry is read from its (already verified) payload.
func callerOf(u authnv1.UserInfo, token string) Caller {
	c := Caller{Username: u.Username, Expires: tokenExpiry(token)}
	if rest, ok := strings.CutPrefix(u.Username, "system:serviceaccount:"); ok {
		if ns, sa, ok := strings.Cut(rest, ":"); ok && ns != "" && sa != "" && !strings.Contains(sa, ":") {
			c.Namespace, c.ServiceAccount = ns, sa
		}
	}
	if c.Namespace != "" { // bound-object claims mean something only for service accounts
		c.Pod = first(u.Extra[ExtraPodName])
		c.PodUID = first(u.Extra[ExtraPodUID])
		if c.Pod != "" { // the node claim comes only with a pod's
			c.Node = first(u.Extra[ExtraNodeName])
			c.NodeUID = first(u.Extra[ExtraNodeUID])
		}
	}
	return c
}

func first(v authnv1.ExtraValue) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// tokenExpiry is the exp claim of a JWT, zero when it has none.
func tokenExpiry(token string) time.Time {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp <= 0 {
		return time.Time{}
	}
	return time.Unix(claims.Exp, 0)
}

// bearerToken is the token of the call's "authorization: Bearer <token>"
// metadata, "" when there is none.
func bearerToken(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		scheme, tok, ok := strings.Cut(strings.TrimSpace(v), " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
	}
	return ""
}

// authenticate verifies the call's token. It fails closed: a server
// without an Authenticator refuses every call.
func (s *Server) authenticate(ctx context.Context) (Caller, error) {
	if s.Auth == nil {
		rejected(ReasonNoAuthenticator)
		return Caller{}, status.Error(codes.Unauthenticated, "the operator's control service has no Authenticator configured "+
			"(control.Server.Auth, e.g. control.TokenReviewer): it refuses every call")
	}
	token := bearerToken(ctx)
	if token == "" {
		rejected(ReasonNoToken)
		return Caller{}, status.Errorf(codes.Unauthenticated, "no bearer token: present the pod's projected service-account token "+
			"for audience %q as \"authorization: Bearer <token>\" (queue-proxy-zl reads it from %s)", Audience, controlv1.DefaultTokenFile)
	}
	c, err := s.Auth.Authenticate(ctx, token)
	if err != nil {
		if status.Code(err) == codes.Unavailable {
			rejected(ReasonReviewUnavailable)
		} else {
			rejected(ReasonUnauthenticated)
		}
		if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.Unauthenticated, err.Error())
		}
		return Caller{}, err
	}
	if !c.Expires.IsZero() && !s.now().Before(c.Expires) {
		rejected(ReasonUnauthenticated)
		return Caller{}, status.Errorf(codes.Unauthenticated, "the token expired at %s", c.Expires.UTC().Format(time.RFC3339))
	}
	return c, nil
}
