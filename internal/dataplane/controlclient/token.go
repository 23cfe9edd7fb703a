package controlclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc/credentials"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Audience is the control stream's token audience (controlv1.Audience).
const Audience = controlv1.Audience

// DefaultTokenFile is where Knative mounts queue-proxy's token for
// Audience (controlv1.DefaultTokenFile).
const DefaultTokenFile = controlv1.DefaultTokenFile

// TokenEnv names the environment variable that overrides DefaultTokenFile.
const TokenEnv = "ZIPTRAIL_TOKEN_FILE"

// TokenFileFromEnv is $ZIPTRAIL_TOKEN_FILE, else DefaultTokenFile.
func TokenFileFromEnv() string {
	if f := os.Getenv(TokenEnv); f != "" {
		return f
	}
	return DefaultTokenFile
}

// TokenSource returns the bearer token to present on a new call.
type TokenSource func() (string, error)

// FileToken reads the token from path on every call: the kubelet rotates
// projected tokens in place, so each new stream (a reconnect) and each
// unary call presents the current one.
func FileToken(path string) TokenSource {
	return func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("service-account token for the operator's control service: %w "+
				"(Knative mounts it at %s when config-deployment lists %q in queue-sidecar-token-audiences; %s overrides the path)",
				err, DefaultTokenFile, Audience, TokenEnv)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("service-account token file %s is empty", path)
		}
		return tok, nil
	}
}

// bearer presents a TokenSource's token as "authorization: Bearer <token>"
// gRPC metadata on every call (a stream asks once, when it opens).
type bearer struct{ src TokenSource }

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if b.src == nil {
		return nil, errors.New("controlclient: no service-account token configured")
	}
	tok, err := b.src()
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

// RequireTransportSecurity is false: the control service listens in the
// cluster network without TLS today (see docs/control-stream.md).
func (bearer) RequireTransportSecurity() bool { return false }

// PerRPCCredentials presents src's token on every call.
func PerRPCCredentials(src TokenSource) credentials.PerRPCCredentials { return bearer{src} }
