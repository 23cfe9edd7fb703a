package call

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"testing"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestRetryReason(t *testing.T) {
	env := &invocation.Envelope{Session: "s", Invocation: "s.1", Attempt: 2}
	echo := http.Header{invocation.HeaderIdempotencyKey: {"s/s.1/2"}}
	refused := &url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
	clientTimeout := &url.Error{Op: "Post", URL: "http://x", Err: timeoutErr{}}
	for _, tc := range []struct {
		name     string
		status   int
		header   http.Header
		err      error
		written  bool
		honoured bool
		want     string
	}{
		{"refused", 0, nil, refused, false, false, RetryRefused},
		{"dns", 0, nil, &url.Error{Op: "Post", Err: &net.DNSError{Err: "no such host", Name: "x"}}, false, false, RetryDNS},
		{"resolve", 0, nil, resolveError{errors.New("resolve ns/f: not ready")}, false, false, RetryResolve},
		{"no connection", 0, nil, io.ErrUnexpectedEOF, false, false, RetryNotSent},
		{"lost answer", 0, nil, io.ErrUnexpectedEOF, true, false, ""},
		{"lost answer, key honoured", 0, nil, io.ErrUnexpectedEOF, true, true, RetryLostResponse},
		{"client timeout", 0, nil, clientTimeout, true, false, ""},
		{"client timeout, key honoured", 0, nil, clientTimeout, true, true, ""},
		{"deadline", 0, nil, context.DeadlineExceeded, true, true, ""},
		{"cancelled", 0, nil, context.Canceled, false, true, ""},
		{"too large", 0, nil, permanentError{errors.New("big")}, true, true, ""},
		{"activator 503", 503, http.Header{}, nil, true, false, RetryUnavailable},
		{"queue-proxy overload 503", 503, nil, nil, true, false, RetryUnavailable},
		{"ingress 502", 502, nil, nil, true, false, RetryUnavailable},
		{"429", 429, nil, nil, true, false, RetryUnavailable},
		{"the function's 503", 503, echo, nil, true, true, ""},
		{"gateway 504", 504, nil, nil, true, false, ""},
		{"gateway 504, key honoured", 504, nil, nil, true, true, RetryGateway},
		{"the function's 500", 500, echo, nil, true, true, ""},
		{"ok", 200, echo, nil, true, true, ""},
	} {
		if got := RetryReason(env, tc.status, tc.header, tc.err, tc.written, tc.honoured); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
