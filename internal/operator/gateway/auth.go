package gateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
)

// The resource the gateway authorizes against: verbs on the sessions
// subresource of Workflows, in the session's namespace, named after the
// workflow. It does not exist in the API server; RBAC rules on it are what
// let a user run and read sessions (charts/ziptrail ships the ClusterRole
// ziptrail-session-runner with every verb).
//
//	create  start a session               POST .../workflows/{wf}/sessions, StartSession
//	get     read a session and its result GET  .../sessions/{id}[/result|/events], GetSession, WaitSession, ReadResult, WatchSession
//	list    list the namespace's sessions GET  .../sessions
const (
	ResourceGroup       = "ziptrail.dev"
	Resource            = "workflows"
	ResourceSubresource = "sessions"
)

// Attributes name what a request wants to do.
type Attributes struct {
	Verb      string // create, get or list
	Namespace string
	// Workflow names the workflow (the resource name); empty for every
	// workflow of the namespace.
	Workflow string
}

func (a Attributes) String() string {
	what := fmt.Sprintf("%s %s/%s (group %s) in namespace %q", a.Verb, Resource, ResourceSubresource, ResourceGroup, a.Namespace)
	if a.Workflow != "" {
		what += fmt.Sprintf(" of workflow %q", a.Workflow)
	}
	return what
}

// Authorizer decides whether the bearer of a token may do something.
type Authorizer interface {
	// Authorize returns the authenticated user's name, or an *AuthError.
	Authorize(ctx context.Context, token string, a Attributes) (user string, err error)
}

// TokenAuthenticator is an Authorizer that also verifies a token alone.
// The gRPC gateway verifies a call's token with it before it reads the
// call's message (grpc.go); the Authorizer then takes the user found from
// the call's context (Verified) instead of reviewing the token again.
// KubeAuth is one.
type TokenAuthenticator interface {
	Authorizer
	// Authenticate returns the token's user, or an *AuthError.
	Authenticate(ctx context.Context, token string) (authnv1.UserInfo, error)
}

// Verified is the user the gRPC gateway's tap found token to be, for the
// call of ctx (ok false when it did not verify that token).
func Verified(ctx context.Context, token string) (authnv1.UserInfo, bool) {
	id, ok := guard.IdentityOf[tokenIdentity](ctx)
	if !ok || id.token != token || token == "" {
		return authnv1.UserInfo{}, false
	}
	return id.user, true
}

// AuthError is a refused request: Code is 401 (no or bad credentials), 403
// (authenticated but not allowed) or 503 (the API server could not decide).
type AuthError struct {
	Code int
	Msg  string
}

func (e *AuthError) Error() string { return e.Msg }

// KubeAuth authenticates bearer tokens with TokenReview and authorizes
// with SubjectAccessReview, caching decisions for a short time so a busy
// client costs the API server little.
type KubeAuth struct {
	// Client creates the reviews; its identity needs create on
	// tokenreviews (authentication.k8s.io) and subjectaccessreviews
	// (authorization.k8s.io).
	Client client.Client
	// Audiences, when set, are the token audiences accepted (default: the
	// API server's).
	Audiences []string
	// TTL is how long an allowed decision is reused (default 10s); denials
	// and rejected tokens are reused for DenyTTL (default 2s).
	TTL, DenyTTL time.Duration
	// MaxEntries bounds each cache (default 8192).
	MaxEntries int
	Now        func() time.Time

	mu     sync.Mutex
	users  map[[32]byte]cached[authnv1.UserInfo]
	access map[string]cached[string] // user+attributes -> "" allowed, else the denial
}

type cached[T any] struct {
	v       T
	err     error
	expires time.Time
}

var errNoToken = &AuthError{Code: http.StatusUnauthorized, Msg: "the session gateway needs Kubernetes credentials: send a bearer token " +
	"(Authorization: Bearer <token>), e.g. your kubeconfig's token or one from `kubectl create token <serviceaccount>`"}

// Authorize implements Authorizer. A token the gRPC gateway verified for
// this call (Verified) is not reviewed again.
func (k *KubeAuth) Authorize(ctx context.Context, token string, a Attributes) (string, error) {
	u, ok := Verified(ctx, token)
	if !ok {
		var err error
		if u, err = k.Authenticate(ctx, token); err != nil {
			return "", err
		}
	}
	return u.Username, k.authorize(ctx, u, a)
}

// Authenticate implements TokenAuthenticator: a TokenReview, its answer
// (an accepted or a rejected token) cached as Authorize's are.
func (k *KubeAuth) Authenticate(ctx context.Context, token string) (authnv1.UserInfo, error) {
	if token == "" {
		return authnv1.UserInfo{}, errNoToken
	}
	return k.authenticate(ctx, token)
}

func (k *KubeAuth) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

func (k *KubeAuth) ttl(err error) time.Duration {
	if err == nil {
		return orDefault(k.TTL, 10*time.Second)
	}
	return orDefault(k.DenyTTL, 2*time.Second)
}

func orDefault(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

func (k *KubeAuth) authenticate(ctx context.Context, token string) (authnv1.UserInfo, error) {
	key := sha256.Sum256([]byte(token))
	now := k.now()
	k.mu.Lock()
	c, ok := k.users[key]
	k.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.v, c.err
	}
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: k.Audiences}}
	if err := k.Client.Create(ctx, tr); err != nil {
		// Not cached: the next request asks again.
		return authnv1.UserInfo{}, &AuthError{Code: http.StatusServiceUnavailable, Msg: fmt.Sprintf("cannot verify the token with the Kubernetes API server (TokenReview): %v", err)}
	}
	var err error
	if !tr.Status.Authenticated {
		why := tr.Status.Error
		if why == "" {
			why = "invalid or expired"
		}
		err = &AuthError{Code: http.StatusUnauthorized, Msg: "the Kubernetes API server rejected the bearer token: " + why}
	}
	k.mu.Lock()
	if k.users == nil {
		k.users = map[[32]byte]cached[authnv1.UserInfo]{}
	}
	trim(k.users, k.max(), now)
	k.users[key] = cached[authnv1.UserInfo]{v: tr.Status.User, err: err, expires: now.Add(k.ttl(err))}
	k.mu.Unlock()
	return tr.Status.User, err
}

func (k *KubeAuth) authorize(ctx context.Context, u authnv1.UserInfo, a Attributes) error {
	key := accessKey(u, a)
	now := k.now()
	k.mu.Lock()
	c, ok := k.access[key]
	k.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.err
	}
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra(u.Extra),
		ResourceAttributes: &authzv1.ResourceAttributes{Namespace: a.Namespace, Verb: a.Verb, Group: ResourceGroup,
			Resource: Resource, Subresource: ResourceSubresource, Name: a.Workflow},
	}}
	if err := k.Client.Create(ctx, sar); err != nil {
		return &AuthError{Code: http.StatusServiceUnavailable, Msg: fmt.Sprintf("cannot check %s's access with the Kubernetes API server (SubjectAccessReview): %v", u.Username, err)}
	}
	var err error
	if !sar.Status.Allowed || sar.Status.Denied {
		msg := fmt.Sprintf("user %q may not %s", u.Username, a)
		if why := strings.TrimSpace(sar.Status.Reason + " " + sar.Status.EvaluationError); why != "" {
			msg += ": " + why
		}
		msg += fmt.Sprintf("; grant it with a RoleBinding in %s to the ClusterRole ziptrail-session-runner (or a Role allowing %s on %s/%s of %s)",
			a.Namespace, a.Verb, Resource, ResourceSubresource, ResourceGroup)
		err = &AuthError{Code: http.StatusForbidden, Msg: msg}
	}
	k.mu.Lock()
	if k.access == nil {
		k.access = map[string]cached[string]{}
	}
	trim(k.access, k.max(), now)
	k.access[key] = cached[string]{err: err, expires: now.Add(k.ttl(err))}
	k.mu.Unlock()
	return err
}

func (k *KubeAuth) max() int {
	if k.MaxEntries > 0 {
		return k.MaxEntries
	}
	return 8192
}

// trim makes room for one entry: expired entries go first, then arbitrary
// ones (map order), so the cache never grows past max.
func trim[K comparable, V any](m map[K]cached[V], max int, now time.Time) {
	if len(m) < max {
		return
	}
	for key, c := range m {
		if !now.Before(c.expires) {
			delete(m, key)
		}
	}
	for key := range m {
		if len(m) < max {
			return
		}
		delete(m, key)
	}
}

// accessKey identifies a decision: everything SubjectAccessReview sees.
func accessKey(u authnv1.UserInfo, a Attributes) string {
	var b strings.Builder
	for _, s := range []string{u.Username, u.UID, a.Verb, a.Namespace, a.Workflow} {
		fmt.Fprintf(&b, "%d:%s|", len(s), s)
	}
	groups := append([]string(nil), u.Groups...)
	sort.Strings(groups)
	for _, g := range groups {
		fmt.Fprintf(&b, "g%d:%s|", len(g), g)
	}
	keys := make([]string, 0, len(u.Extra))
	for k := range u.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "e%d:%s=", len(k), k)
		for _, v := range u.Extra[k] {
			fmt.Fprintf(&b, "%d:%s,", len(v), v)
		}
		b.WriteByte('|')
	}
	return b.String()
}

func extra(in map[string]authnv1.ExtraValue) map[string]authzv1.ExtraValue {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]authzv1.ExtraValue, len(in))
	for k, v := range in {
		out[k] = authzv1.ExtraValue(v)
	}
	return out
}

// bearer extracts the token of an "Authorization: Bearer <token>" value.
func bearer(header string) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// authError converts any error of an Authorizer into an *AuthError.
func authError(err error) *AuthError {
	var ae *AuthError
	if errors.As(err, &ae) {
		return ae
	}
	return &AuthError{Code: http.StatusServiceUnavailable, Msg: err.Error()}
}
