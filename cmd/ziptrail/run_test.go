package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ziptrail/ziptrail/internal/gateway"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/sessions"
)

// engine plays the trigger engine behind the real gateway: a session of
// "upper" invokes one function and completes with its input upper-cased.
type engine struct {
	reg *sessions.Registry
	mu  sync.Mutex
	n   int
}

func (e *engine) StartSession(_ context.Context, ns, wf string, input []byte) (string, error) {
	if wf != "upper" {
		return "", fmt.Errorf("%w: %s/%s", gateway.ErrWorkflowNotFound, ns, wf)
	}
	e.mu.Lock()
	e.n++
	id := fmt.Sprintf("upper-%d", e.n)
	e.mu.Unlock()
	if err := e.reg.Start(id, ns, wf); err != nil {
		return "", err
	}
	// The event stream replays the whole log, so the client sees every
	// event however early the session ends.
	go func() {
		e.reg.Log(id, "Invoked", "shout with 1 objects (trigger entry)")
		_ = e.reg.Update(id, func(s *sessions.Session) { s.Invocations++; s.Objects++ })
		out := bytes.ToUpper(input)
		_ = e.reg.Finish(id, sessions.Completed, &sessions.Result{Bucket: "output", Key: "result", Size: int64(len(out)), Inline: out}, "")
	}()
	return id, nil
}

type inline struct{}

func (inline) OpenResult(_ context.Context, _ string, r *sessions.Result) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(r.Inline)), nil
}

// startGateway serves the real session gateway and records its address in a
// state dir, as `ziptrail local up` does.
func startGateway(t *testing.T) (stateDir string) {
	reg := sessions.NewRegistry()
	srv := httptest.NewServer(gateway.New(&gateway.Handler{Starter: &engine{reg: reg}, Sessions: reg, Results: inline{}}))
	t.Cleanup(srv.Close)
	stateDir = t.TempDir()
	data, _ := json.Marshal(localcluster.State{GatewayURL: srv.URL})
	if err := os.WriteFile(localcluster.StateFile(stateDir), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return stateDir
}

func TestRunAndSessions(t *testing.T) {
	state := startGateway(t)
	ctx := context.Background()
	in := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(in, []byte("hello ziptrail"), 0o644); err != nil {
		t.Fatal(err)
	}

	var out, progress bytes.Buffer
	if err := runRun(ctx, []string{"upper", "--input", in, "-n", "team-a", "--state-dir", state}, nil, &out, &progress); err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	if out.String() != "HELLO ZIPTRAIL\n" {
		t.Errorf("result %q", out.String())
	}
	for _, want := range []string{"==> session upper-1 of team-a/upper started (14 bytes of input)", "Invoked      shout with 1 objects",
		"Completed", "==> Completed in ", "1 invocations, 1 objects; result 14 bytes"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}

	// stdin, flags before the workflow, quiet.
	out.Reset()
	progress.Reset()
	if err := runRun(ctx, []string{"-q", "--state-dir", state, "-n", "team-a", "--input", "-", "upper"}, strings.NewReader("again"), &out, &progress); err != nil {
		t.Fatal(err)
	}
	if out.String() != "AGAIN\n" || progress.Len() != 0 {
		t.Errorf("quiet run: result %q, progress %q", out.String(), progress.String())
	}

	err := runRun(ctx, []string{"nope", "--state-dir", state}, nil, &out, &progress)
	if err == nil || !strings.Contains(err.Error(), "workflow not found: default/nope") {
		t.Errorf("unknown workflow: %v", err)
	}

	out.Reset()
	if err := runSessions(ctx, []string{"-n", "team-a", "--state-dir", state}, &out, &progress); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SESSION") || !strings.HasPrefix(lines[1], "upper-2 ") || !strings.HasPrefix(lines[2], "upper-1 ") {
		t.Fatalf("sessions table, newest first:\n%s", out.String())
	}
	if f := strings.Fields(lines[2]); f[1] != "upper" || f[2] != "Completed" || f[3] != "1" || f[4] != "1" {
		t.Errorf("row %q", lines[2])
	}

	out.Reset()
	if err := runSessions(ctx, []string{"other", "-n", "team-a", "--state-dir", state}, &out, &progress); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no sessions") {
		t.Errorf("filtered by workflow: %q", out.String())
	}
}

func TestRunWithoutCluster(t *testing.T) {
	err := runRun(context.Background(), []string{"upper", "--state-dir", t.TempDir()}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ziptrail local up") {
		t.Errorf("want a hint to start the local cluster, got %v", err)
	}
}
