package sidecar

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// controlServer runs the real control server (tokens "valid:<ns>:<pod>")
// with ev as the engine's side; it returns its address.
func controlServer(t testing.TB, ev control.Events, opts ...grpc.ServerOption) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := control.NewServer(ev, oneKey{})
	srv.Auth = tokenAuth{}
	gs := grpc.NewServer(opts...)
	controlv1.RegisterControlServer(gs, srv)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

// workflowSidecar starts the sidecar of pod (function fn of workflow
// ns/wf) on the control server at addr.
func workflowSidecar(t testing.TB, addr, pod, fn string, configure ...func(*Config)) *Sidecar {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("valid:ns:"+pod), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Namespace: "ns", Workflow: "wf", Function: fn, Pod: pod, PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t),
		ShmDir: t.TempDir(), MemoryLimit: 1 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute, OperatorAddr: addr, TokenFile: tok}
	for _, f := range configure {
		f(&cfg)
	}
	s := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}
