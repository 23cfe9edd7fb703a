package orchestrator

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestASaveNeverHoldsADecisionWithoutItsArguments is the chaos checker's
// stuck fan session (sharded, kill-leader): the engine records an
// invocation when it decides it, and the orchestrator records the
// arguments a new owner sends it again from a moment later (invoke). A
// save between the two held the invocation as never started and without
// arguments; the owner was SIGKILLed before its next save; the new owner
// restored an invocation that nothing would ever send again (only those
// started with arguments are), the trigger that fired it closed: the
// session stayed Running until its deadline. Now a snapshot is taken only
// between applications: the save asked for while an invocation is being
// decided waits until its arguments are recorded.
func TestASaveNeverHoldsADecisionWithoutItsArguments(t *testing.T) {
	rs := servers.StartRedis(t)
	wf, fns, sinks := accWorkflow(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(servers.FreePort(t)))

	// Saves only when asked (a start, and the test below).
	rig := startAckRig(t, addr, rs.Addr, wf, fns, time.Hour)
	reached, release := make(chan struct{}), make(chan struct{})
	rig.o.testHookInvoke = func(a engine.Action) {
		if a.Function == "sink" {
			close(reached)
			<-release
		}
	}
	id, err := rig.o.StartSession(context.Background(), "ns", "acc", []byte("in"))
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
	select {
	case <-reached: // sink decided, its arguments not recorded yet
	case <-time.After(30 * time.Second):
		t.Fatal("sink was never decided")
	}
	saved := make(chan error, 1)
	go func() { saved <- rig.o.durable(ctx) }()
	// A save that does not wait for the decision ends at once; one that
	// waits is still waiting after a second (either way the decision then
	// goes on, and the save ends).
	select {
	case <-saved:
		saved <- nil
	case <-time.After(time.Second):
	}
	close(release)
	if err := <-saved; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sink invoked", func() bool { return sinks.Load() == 1 })
	rig.crash() // SIGKILLed: nothing saved after that save

	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	data, _, found, err := (&checkpoint.Store{Client: rc, Key: "ziptrail:test:acks"}).Load(context.Background())
	if err != nil || !found {
		t.Fatalf("checkpoint: found %v, %v", found, err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	e := engine.New(1)
	if err := e.Restore(st.Engine); err != nil {
		t.Fatal(err)
	}
	var sinkInv string
	for _, s := range st.Engine.Sessions {
		for inv, is := range s.Invocations {
			if is.Function == "sink" {
				sinkInv = inv
			}
		}
	}
	if sinkInv == "" {
		return // saved before the decision: its event, unacknowledged, is sent again
	}
	if !e.Outstanding(id, sinkInv) {
		return // finished
	}
	for _, c := range e.InFlight() {
		if c.Invocation == sinkInv {
			return // the next owner sends it again
		}
	}
	t.Fatalf("the checkpoint holds invocation %s of sink as decided, neither started nor finished: a new owner would never send it", sinkInv)
}

// redisHold is a go-redis hook that holds the next script (a checkpoint
// write) once armed: it says so on writing, and goes on when released.
type redisHold struct {
	armed   atomic.Bool
	writing chan struct{}
	release chan struct{}
}

func (h *redisHold) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *redisHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && h.armed.CompareAndSwap(true, false) {
			close(h.writing)
			<-h.release
		}
		return next(ctx, cmd)
	}
}
func (h *redisHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestAnOutcomeAppliedElsewhereIsAcknowledgedOnlyOnceSaved: an engine-
// dispatched invocation's outcome arrives twice, from the dispatcher's
// response and from the sidecar's FunctionFinished; the second finds it
// settled and changes nothing. Its acknowledgement waited for a save
// covering the version number current at that moment, but the first one
// had changed the engine and not yet counted its change (it was still
// carrying out what the outcome fired): a save whose snapshot was taken
// before the outcome, and which ended just after, acknowledged it, though
// no checkpoint held it. A SIGKILL then lost the outcome the sidecar no
// longer kept (with the chaos checker's stuck fan sessions: a reduce's
// outcome). Now an acknowledgement waits for a save whose snapshot is
// taken after it was asked for.
func TestAnOutcomeAppliedElsewhereIsAcknowledgedOnlyOnceSaved(t *testing.T) {
	rs := servers.StartRedis(t)
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fan"}, Spec: v1alpha1.WorkflowSpec{
		Entry: "entry", OutputBucket: "out", SessionDeadline: &metav1.Duration{Duration: time.Minute},
		Functions: []v1alpha1.FunctionSpec{{Name: "entry"}, {Name: "reduce"}},
		Triggers: []v1alpha1.NamedTrigger{{Name: "by-group", Spec: v1alpha1.TriggerSpec{Bucket: "shuffle", Primitive: v1alpha1.DynamicGroup,
			DynamicGroup: &v1alpha1.DynamicGroupParams{GroupMetadataKey: "g", Sources: []string{"entry"}}, Targets: []string{"reduce"}}}},
	}}
	// The entry's response never comes (its outcome arrives from its
	// sidecar alone, below); reduce answers.
	hang := make(chan struct{})
	defer close(hang)
	fns := &servers.Functions{}
	fns.Add(t, "fan-entry", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	fns.Add(t, "fan-reduce", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(servers.FreePort(t)))
	rig := startAckRig(t, addr, rs.Addr, wf, fns, time.Hour)
	hold := &redisHold{writing: make(chan struct{}), release: make(chan struct{})}
	rig.rc.AddHook(hold)
	deciding, decided := make(chan struct{}), make(chan struct{})
	rig.o.testHookInvoke = func(a engine.Action) {
		if a.Function == "reduce" {
			close(deciding)
			<-decided
		}
	}
	ctx := context.Background()
	id, err := rig.o.StartSession(ctx, "ns", "fan", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	from := control.Identity{Namespace: "ns", Pod: "entry-1", Workflow: "fan", Function: "entry"}
	inv := id + ".0"
	if err := rig.o.ObjectReady(ctx, from, &controlv1.ObjectReady{Session: id, Bucket: "shuffle", Key: "k1", Inline: []byte("x"),
		Metadata: map[string]string{"g": "a"}, ProducerFunction: "entry", InvocationId: inv}); err != nil {
		t.Fatal(err)
	}
	// A save takes its snapshot (the entry still running) and is held
	// on its way to Redis.
	hold.armed.Store(true)
	saved := make(chan error, 1)
	go func() { saved <- rig.o.durable(ctx) }()
	<-hold.writing
	// The entry's outcome is applied (the first report) and is still
	// carrying out what it fired (reduce) ...
	fin := &controlv1.FunctionFinished{Session: id, Function: "entry", InvocationId: inv, OutputsSent: 1}
	first := make(chan error, 1)
	go func() { first <- rig.o.FunctionFinished(ctx, from, fin) }()
	<-deciding
	// ... when the second report arrives: settled, nothing to apply.
	if err := rig.o.FunctionFinished(ctx, from, fin); err != nil {
		t.Fatal(err)
	}
	ack := rig.o.Saved(from)
	close(hold.release)
	if err := <-saved; err != nil {
		t.Fatal(err)
	}
	select {
	case <-ack:
		t.Fatal("the outcome was acknowledged by a save whose snapshot was taken before it: no checkpoint holds it")
	default:
	}
	close(decided)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// The next save holds it: acknowledged then.
	if err := rig.o.durable(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ack:
	default:
		t.Fatal("a save after the outcome did not acknowledge it")
	}
}
