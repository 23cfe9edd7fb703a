package orchestrator

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// podTokens is an Authenticator for tests about the stream, not its
// authentication: token "pod:<ns>:<pod>" is that pod's.
type podTokens struct{}

func (podTokens) Authenticate(_ context.Context, token string) (control.Caller, error) {
	p := strings.Split(token, ":")
	if len(p) != 3 || p[0] != "pod" {
		return control.Caller{}, status.Error(codes.Unauthenticated, "not a test token")
	}
	return control.Caller{Username: "system:serviceaccount:" + p[1] + ":fn", Namespace: p[1], ServiceAccount: "fn", Pod: p[2], PodUID: p[1] + "-" + p[2]}, nil
}

type keys32 struct{}

func (keys32) Keys(context.Context, string) (*controlv1.Keys, error) {
	return &controlv1.Keys{ActiveKeyId: "k1", Keys: []*controlv1.Key{{Id: "k1", Secret: make([]byte, 32)}}}, nil
}

// ackRig is an operator (orchestrator and control server on addr) that the
// test can crash: its checkpoint store has its own Redis connection, which
// a crash closes before anything else, so nothing is saved after it.
type ackRig struct {
	o      *Orchestrator
	events *countedEvents // what the control server got from sidecars
	srv    *control.Server
	rc     *redis.Client
	gs     *grpc.Server
	cancel context.CancelFunc
	done   chan error
}

func startAckRig(t *testing.T, addr, redisAddr string, wf *v1alpha1.Workflow, fns *servers.Functions, interval time.Duration) *ackRig {
	return startAckRigReconciled(t, addr, redisAddr, wf, fns, interval, 0)
}

// startAckRigReconciled is startAckRig whose Workflow reconciler hands the
// workflow to the engine only reconcileAfter after Run started (0: before),
// as a new leader's reconciler does; Run loads it itself
// (Options.LoadWorkflows).
func startAckRigReconciled(t *testing.T, addr, redisAddr string, wf *v1alpha1.Workflow, fns *servers.Functions, interval, reconcileAfter time.Duration) *ackRig {
	t.Helper()
	r := &ackRig{rc: redis.NewClient(&redis.Options{Addr: redisAddr}), done: make(chan error, 1)}
	var err error
	opts := Options{Resolver: fns, Log: logr.Discard(), CheckpointInterval: interval,
		Checkpoint: &checkpoint.Store{Client: r.rc, Key: "ziptrail:test:acks"}}
	if reconcileAfter > 0 {
		opts.LoadWorkflows = func(context.Context) ([]v1alpha1.Workflow, error) { return []v1alpha1.Workflow{*wf}, nil }
	}
	r.o, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.events = &countedEvents{Orchestrator: r.o}
	srv := control.NewServer(r.events, keys32{})
	srv.Auth = podTokens{}
	r.o.SetControl(srv)
	r.srv = srv
	if reconcileAfter == 0 {
		if err := r.o.SetWorkflow(wf, true, ""); err != nil {
			t.Fatal(err)
		}
	} else {
		reconciler := time.AfterFunc(reconcileAfter, func() { _ = r.o.SetWorkflow(wf, true, "") })
		t.Cleanup(func() { reconciler.Stop() })
	}
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(context.Background())
	go func() { r.done <- r.o.Run(ctx) }()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r.gs = grpc.NewServer()
	controlv1.RegisterControlServer(r.gs, srv)
	go func() { _ = r.gs.Serve(ln) }()
	t.Cleanup(r.crash)
	return r
}

// countedEvents is the orchestrator as the control server's Events,
// counting the outcomes sidecars report.
type countedEvents struct {
	*Orchestrator
	objects, finished atomic.Int32
}

func (c *countedEvents) ObjectReady(ctx context.Context, from control.Identity, ev *controlv1.ObjectReady) error {
	c.objects.Add(1)
	return c.Orchestrator.ObjectReady(ctx, from, ev)
}

func (c *countedEvents) FunctionFinished(ctx context.Context, from control.Identity, ev *controlv1.FunctionFinished) error {
	c.finished.Add(1)
	return c.Orchestrator.FunctionFinished(ctx, from, ev)
}

// crash stops the operator as a SIGKILL would, as far as the checkpoint
// goes: nothing more is saved.
func (r *ackRig) crash() {
	_ = r.rc.Close()
	r.gs.Stop()
	r.cancel()
	<-r.done
	r.done <- nil // a second crash returns at once
}

// TestAcknowledgedEventsSurviveACrash is issue 32's defect 2: the control
// server acknowledged an event as soon as the engine had applied it in
// memory, the sidecar forgot it, and an operator crash before the next
// save lost it for good. Now the acknowledgement waits for a checkpoint
// that holds the event; an event not acknowledged is sent again to the
// next operator, which applies it.
func TestAcknowledgedEventsSurviveACrash(t *testing.T) {
	ackCrashThenRestore(t, 0)
}

// TestEventsResentBeforeANewOwnersReconcilerRanAreKept: a new owner (a
// leader after a takeover) serves the control stream as soon as it runs,
// while its Workflow reconciler hands it the workflows only later. The
// sidecar's event, sent again to it at once, was refused ("unknown
// workflow") and then acknowledged: lost, and the session stuck (the
// chaos checker's kill-leader phase). Now Run loads the workflows before
// it serves, and events wait for it.
func TestEventsResentBeforeANewOwnersReconcilerRanAreKept(t *testing.T) {
	ackCrashThenRestore(t, 3*time.Second)
}

// accWorkflow is workflow ns/acc: entry's objects in bucket acc fire sink
// (Immediate), with function servers for both; sinks counts sink's runs.
func accWorkflow(t *testing.T) (*v1alpha1.Workflow, *servers.Functions, *atomic.Int32) {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "acc"}, Spec: v1alpha1.WorkflowSpec{
		Entry: "entry", OutputBucket: "out", SessionDeadline: &metav1.Duration{Duration: time.Minute},
		Functions: []v1alpha1.FunctionSpec{{Name: "entry"}, {Name: "sink"}},
		Triggers:  []v1alpha1.NamedTrigger{immediate("acc", "acc", "sink")},
	}}
	fns := &servers.Functions{}
	fns.Add(t, "acc-entry", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	sinks := &atomic.Int32{}
	fns.Add(t, "acc-sink", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { sinks.Add(1) }))
	return wf, fns, sinks
}

func ackCrashThenRestore(t *testing.T, reconcileAfter time.Duration) {
	rs := servers.StartRedis(t)
	wf, fns, sinks := accWorkflow(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(servers.FreePort(t)))

	// The first operator saves only when asked (a start): the event
	// below is applied and never saved by it.
	first := startAckRig(t, addr, rs.Addr, wf, fns, time.Hour)
	id, err := first.o.StartSession(context.Background(), "ns", "acc", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	cl := controlclient.NewClient(addr, func() (string, error) { return "pod:ns:entry-1", nil },
		&controlv1.Hello{Namespace: "ns", Pod: "entry-1", Workflow: "acc", Function: "entry"}, controlclient.Commands{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = cl.Run(ctx) }()
	if err := cl.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{
		Session: id, Bucket: "acc", Key: "k1", Inline: []byte("x"), ProducerFunction: "entry", InvocationId: id + ".0"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the event applied by the first operator", func() bool { return sinks.Load() == 1 })
	// Whatever the first operator acknowledges, it acknowledges soon
	// after applying: give it that chance before the crash.
	for deadline := time.Now().Add(time.Second); cl.Unacked() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	acked := cl.Unacked() == 0
	first.crash()

	second := startAckRigReconciled(t, addr, rs.Addr, wf, fns, 20*time.Millisecond, reconcileAfter)
	waitFor(t, "the session restored", func() bool {
		select {
		case err := <-second.done:
			t.Fatalf("second operator: %v", err)
		default:
		}
		_, err := second.o.Sessions().Get(id)
		return err == nil
	})
	deadline := time.Now().Add(10*time.Second + reconcileAfter)
	for sinks.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if sinks.Load() < 2 {
		t.Fatalf("the event the first operator applied (acknowledged before the crash: %v) never reached the second one: lost", acked)
	}
	if acked {
		t.Error("the first operator acknowledged an event no checkpoint held")
	}
	// The second one saves every 20 ms: its acknowledgement comes.
	waitFor(t, "the acknowledgement after a save", func() bool { return cl.Unacked() == 0 })
}

// oneBucket puts every workflow in bucket "b0".
type oneBucket struct{}

func (oneBucket) BucketOf(string, string) string                    { return "b0" }
func (oneBucket) Generation(context.Context, string) (int64, error) { return 1, nil }

// TestAReplicaThatStoppedServingAcknowledgesNothing: an event applied by a
// bucket's orchestrator waits for a save that holds it; when the replica
// stops serving the bucket between the event's application and the
// control server's question (the bucket given up, or its engine stopped
// for a newer owner, whose saves are refused), the answer is a channel
// that never closes, not "nothing to wait for": the event is sent again
// to the next owner rather than acknowledged unsaved.
func TestAReplicaThatStoppedServingAcknowledgesNothing(t *testing.T) {
	s, err := NewSharded(ShardedOptions{Buckets: oneBucket{}})
	if err != nil {
		t.Fatal(err)
	}
	from := control.Identity{Namespace: "ns", Workflow: "wf"}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	if ch := s.Saved(from); ch == nil || closed(ch) {
		t.Fatalf("a bucket this replica does not hold: %v (closed %v), want a channel that never closes", ch, ch != nil && closed(ch))
	}
	o, err := New(Options{Resolver: &servers.Functions{}, Checkpoint: &checkpoint.Store{Key: "unused"}, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	sh := &shard{bucket: "b0", o: o, serving: true}
	s.shards["b0"] = sh
	o.touch() // an event applied
	ch := s.Saved(from)
	if ch == nil || closed(ch) {
		t.Fatal("an event applied and not saved is acknowledged at once")
	}
	o.waiters.settle(o.waiters.take(), true) // a save holds it
	if !closed(ch) {
		t.Fatal("a saved event is not acknowledged")
	}
	o.touch() // another event; then the engine stops for a newer owner
	sh.mu.Lock()
	sh.serving = false
	sh.mu.Unlock()
	if ch := s.Saved(from); ch == nil || closed(ch) {
		t.Fatal("a replica that stopped serving acknowledges an event no save of its holds")
	}
}
