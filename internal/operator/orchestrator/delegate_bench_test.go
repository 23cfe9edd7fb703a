package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/dataplane/sidecar"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// benchAuth accepts "pod:<ns>:<pod>" as that pod's token (the real
// TokenReview is TestDelegationTrust's; here only the path's cost counts).
type benchAuth struct{}

func (benchAuth) Authenticate(_ context.Context, token string) (control.Caller, error) {
	p := strings.Split(token, ":")
	if len(p) != 3 || p[0] != "pod" {
		return control.Caller{}, status.Error(codes.Unauthenticated, "rejected")
	}
	return control.Caller{Username: "system:serviceaccount:" + p[1] + ":fn", Namespace: p[1], ServiceAccount: "fn", Pod: p[2], PodUID: p[2]}, nil
}

type fixedKeys struct{}

func (fixedKeys) Keys(context.Context, string) (*controlv1.Keys, error) {
	return &controlv1.Keys{ActiveKeyId: "k1", Keys: []*controlv1.Key{{Id: "k1", Secret: make([]byte, 32)}}}, nil
}

// BenchmarkChainStep is the orchestration step in process: a 50-step
// chain between two functions (a ring, Immediate triggers), each behind
// its own real sidecar connected to the operator's control server, with
// the engine firing every step (Delegate off) or the producers' sidecars
// (Delegate on), without checkpoints or saving them in a real Redis.
// ms/step is a session's time over its steps.
func BenchmarkChainStep(b *testing.B) {
	for _, redis := range []bool{false, true} {
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("redis=%v/delegate=%v", redis, on), func(b *testing.B) { benchChain(b, on, redis) })
		}
	}
}

func benchChain(b *testing.B, delegate, redis bool) {
	const steps = 50
	opts := Options{Resolver: &servers.Functions{}, Log: logr.Discard(), Delegate: delegate}
	if redis {
		opts.Checkpoint = &checkpoint.Store{Client: servers.StartRedis(b).Client, Key: "ziptrail:bench:chain"}
	}
	o, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	fns := o.opts.Resolver.(*servers.Functions)
	srv := control.NewServer(o, fixedKeys{})
	srv.Auth = benchAuth{}
	o.SetControl(srv)
	gs := grpc.NewServer()
	controlv1.RegisterControlServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	b.Cleanup(gs.Stop)

	// f sends n-1 to the next function's bucket, or its result at 0.
	step := func(next string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			env, err := invocation.Decode(r.Body)
			if err != nil || len(env.Objects) != 1 {
				http.Error(w, fmt.Sprint(err), http.StatusBadRequest)
				return
			}
			n, _ := strconv.Atoi(string(env.Objects[0].Inline))
			out := invocation.Object{Bucket: next, Key: "k" + strconv.Itoa(n), Inline: []byte(strconv.Itoa(n - 1))}
			if n <= 0 {
				out = invocation.Object{Bucket: "output", Key: "result", Inline: []byte("done")}
			}
			w.Header().Set("Content-Type", invocation.OutputsContentType)
			_ = json.NewEncoder(w).Encode(invocation.Outputs{Objects: []invocation.Object{out}})
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	for _, fn := range []struct{ name, next string }{{"a", "to-b"}, {"b", "to-a"}} {
		tok := filepath.Join(b.TempDir(), "token")
		if err := os.WriteFile(tok, []byte("pod:ns:chain-"+fn.name+"-1"), 0o600); err != nil {
			b.Fatal(err)
		}
		s := sidecar.New(sidecar.Config{Namespace: "ns", Workflow: "chain", Function: fn.name, Pod: "chain-" + fn.name + "-1", PodIP: "127.0.0.1",
			DataplanePort: servers.FreePort(b), ShmDir: b.TempDir(), MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute,
			OperatorAddr: ln.Addr().String(), TokenFile: tok})
		if err := s.Start(ctx); err != nil {
			b.Fatal(err)
		}
		fns.Add(b, "chain-"+fn.name, s.Wrap(step(fn.next)))
	}
	wf := testWorkflow("chain", "a", "a", "b")
	wf.Spec.OutputBucket = "output"
	wf.Spec.Triggers = []v1alpha1.NamedTrigger{immediate("to-b", "to-b", "b"), immediate("to-a", "to-a", "a")}
	if err := o.SetWorkflow(wf, true, ""); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	run := func() {
		id, err := o.StartSession(ctx, "ns", "chain", []byte(strconv.Itoa(steps)))
		if err != nil {
			b.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer wcancel()
		s, err := o.Sessions().Wait(wctx, id)
		if err != nil || s.State != sessions.Completed {
			b.Fatalf("session %s: %v %+v", id, err, s)
		}
	}
	run() // warm: connections, delegations in place
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		run()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N*(steps+1)), "ms/step")
}
