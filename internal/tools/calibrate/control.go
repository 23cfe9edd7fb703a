package calibrate

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// sdkFuncPy are the control-path sessions' functions (Python SDK).
//
//go:embed sdkfunc.py
var sdkFuncPy []byte

// ControlPoint is the shape of one control-path session: Maps map tasks,
// each announcing ObjectsPerMap objects (a shuffle's pointers) spread
// over Groups groups, one reducer per group.
type ControlPoint struct {
	Maps          int `json:"maps"`
	ObjectsPerMap int `json:"objectsPerMap"`
	Groups        int `json:"groups"`
	// Hold keeps the session open this long once every reducer finished,
	// busy: its collector sends a tick object every holdTick, so that the
	// engine, which keeps every object of the session, saves its state at
	// every checkpoint as it does while a shuffle runs (an idle session
	// is not saved again).
	Hold time.Duration `json:"hold,omitempty"`
}

// controlPoints are the sessions measured: different mixes of objects
// and invocations, so that the fit can tell the two costs apart.
func controlPoints(quick bool) []ControlPoint {
	if quick {
		return []ControlPoint{{2, 64, 8, 0}, {8, 8, 32, 0}, {4, 128, 4, 0}, {4, 128, 4, time.Second}}
	}
	return []ControlPoint{{4, 64, 16, 0}, {16, 16, 64, 0}, {8, 256, 32, 0}, {4, 512, 8, 0}, {32, 16, 128, 0},
		{4, 512, 8, 5 * time.Second}, {8, 512, 16, 5 * time.Second}, {8, 1024, 16, 10 * time.Second}}
}

// holdTick is the period of a held session's ticks (sdkfunc.py's collect).
const holdTick = 100 * time.Millisecond

// holdTicks is the number of tick objects a session held for hold sends.
func holdTicks(hold time.Duration) int { return int(hold / holdTick) }

// ControlSample is one control-path session: what it did and the CPU of
// each process on the path while it ran, the processes' idle CPU over the
// same time subtracted (their idle use is the installation's background,
// not the session's).
type ControlSample struct {
	ControlPoint
	// Objects are the objects the session's tasks announced to buckets
	// besides their invocations' inputs: the maps' objects, the
	// reducers' outputs and the result. Sends are the maps' objects, sent
	// through the SDK's client (the rest go with the responses).
	Objects     int     `json:"objects"`
	Sends       int     `json:"sends"`
	Invocations int     `json:"invocations"`
	Seconds     float64 `json:"seconds"`
	// ObjectSeconds are the objects the engine kept times how long: all
	// of them over the hold, half of them over the rest (they arrive
	// during the maps and stay to the session's end).
	ObjectSeconds float64 `json:"objectSeconds"`
	// EngineCPU is this process's (the orchestrator: engine, control
	// server, dispatcher, checkpoints); SidecarCPU the two
	// queue-proxy-zl's; StoreCPU redis-server's (the checkpoints);
	// FunctionCPU the Python function servers'. Seconds of CPU.
	EngineCPU   float64 `json:"engineCPU"`
	SidecarCPU  float64 `json:"sidecarCPU"`
	StoreCPU    float64 `json:"storeCPU"`
	FunctionCPU float64 `json:"functionCPU"`
	// IdleCores is the same processes' CPU while no session ran, in cores
	// (engine, sidecars, store, functions), subtracted above.
	IdleCores [4]float64 `json:"idleCores"`
}

// Platform is the sample's CPU on the control path: engine, sidecars and
// store.
func (s ControlSample) Platform() float64 { return s.EngineCPU + s.SidecarCPU + s.StoreCPU }

// controlEnv is a real engine (an orchestrator in this process with its
// control server on loopback and its checkpoints in the run's Redis),
// two real queue-proxy-zl connected to it (pods "map" and "reduce", each
// in front of a Python function server) and the workflow "control".
type controlEnv struct {
	tb       *servers.ProcessTB
	o        *orchestrator.Orchestrator
	sidecars []*sidecarPod
	funcs    []*pyProcess
	redisPID int
	idle     [4]float64
	stop     func()
}

// podAuth accepts "<secret>:<pod>" as that pod's token in namespace
// "calibrate" (the control server listens on loopback for the run only;
// the secret is random per run).
type podAuth struct{ secret string }

func (a podAuth) Authenticate(_ context.Context, token string) (control.Caller, error) {
	secret, pod, ok := strings.Cut(token, ":")
	if !ok || subtle.ConstantTimeCompare([]byte(secret), []byte(a.secret)) != 1 || pod == "" {
		return control.Caller{}, status.Error(codes.Unauthenticated, "rejected")
	}
	return control.Caller{Username: "system:serviceaccount:calibrate:fn", Namespace: "calibrate", ServiceAccount: "fn", Pod: pod, PodUID: pod}, nil
}

// oneKey is the namespace's reference key, the one the sidecars' key file
// has.
type oneKey struct{ secret []byte }

func (k oneKey) Keys(context.Context, string) (*controlv1.Keys, error) {
	return &controlv1.Keys{ActiveKeyId: "k1", Keys: []*controlv1.Key{{Id: "k1", Secret: k.secret}}}, nil
}

// routes resolves the workflow's Services to the sidecars: split and map
// to pod "map", reduce and collect to pod "reduce".
type routes map[string]*url.URL

func (r routes) URL(_ context.Context, _, svc string) (*url.URL, error) {
	fn := svc[strings.LastIndexByte(svc, '-')+1:]
	if u, ok := r[fn]; ok {
		return u, nil
	}
	return nil, fmt.Errorf("no function %s", svc)
}

const controlWorkflow = "control"

func controlWorkflowSpec() *v1alpha1.Workflow {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "calibrate", Name: controlWorkflow},
		Spec: v1alpha1.WorkflowSpec{Entry: "split", OutputBucket: "output", SessionDeadline: &metav1.Duration{Duration: 10 * time.Minute}}}
	for _, f := range []string{"split", "map", "reduce", "collect"} {
		wf.Spec.Functions = append(wf.Spec.Functions, v1alpha1.FunctionSpec{Name: f})
	}
	group := func(name, bucket, source, target string) v1alpha1.NamedTrigger {
		return v1alpha1.NamedTrigger{Name: name, Spec: v1alpha1.TriggerSpec{Bucket: bucket, Primitive: v1alpha1.DynamicGroup, Targets: []string{target},
			DynamicGroup: &v1alpha1.DynamicGroupParams{GroupMetadataKey: "group", Sources: []string{source}}}}
	}
	// the held sessions' ticks (no trigger: kept, as every object is)
	wf.Spec.Buckets = []v1alpha1.NamedBucket{{Name: "ticks"}}
	wf.Spec.Triggers = []v1alpha1.NamedTrigger{
		{Name: "tasks", Spec: v1alpha1.TriggerSpec{Bucket: "tasks", Primitive: v1alpha1.Immediate, Targets: []string{"map"}}},
		group("shuffle", "shuffle", "map", "reduce"),
		group("parts", "parts", "reduce", "collect"),
	}
	return wf
}

// startControl brings the control path up and measures its idle CPU.
func (r *runner) startControl(ctx context.Context) (_ *controlEnv, err error) {
	cfg := r.cfg
	pid, ok := cfg.ServerPIDs[Redis]
	if !ok {
		return nil, fmt.Errorf("the control path needs the Redis server's process (--local)")
	}
	e := &controlEnv{tb: &servers.ProcessTB{}, redisPID: pid}
	if _, err := os.Stat("/dev/shm"); err == nil {
		e.tb.Dir = "/dev/shm"
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	err = e.tb.Do(func() {
		e.tb.Cleanup(cancel)
		dir := e.tb.TempDir()
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		keys := filepath.Join(dir, "keys.json")
		if err := os.WriteFile(keys, []byte(`{"active":"k1","keys":{"k1":"`+base64.StdEncoding.EncodeToString(key)+`"}}`), 0o600); err != nil {
			e.tb.Fatal(err)
		}
		sec := make([]byte, 16)
		_, _ = rand.Read(sec)
		secret := hex.EncodeToString(sec)

		ro := *cfg.Redis
		rc := redis.NewClient(&ro)
		ckey := "ziptrail-calibrate:engine:" + secret[:8]
		e.tb.Cleanup(func() { _ = rc.Del(context.Background(), ckey).Err(); _ = rc.Close() })
		rt := routes{}
		o, err := orchestrator.New(orchestrator.Options{Resolver: rt, Log: logr.Discard(), Checkpoint: &checkpoint.Store{Client: rc, Key: ckey},
			CheckpointInterval: cfg.CheckpointInterval})
		if err != nil {
			e.tb.Fatal(err)
		}
		r.m.CheckpointMaxShare = orchestrator.DefaultCheckpointMaxShare // New's default, as installed
		srv := control.NewServer(o, oneKey{key})
		srv.Auth = podAuth{secret}
		o.SetControl(srv)
		gs := grpc.NewServer(control.ServerOptions()...)
		controlv1.RegisterControlServer(gs, srv)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			e.tb.Fatal(err)
		}
		go func() { _ = gs.Serve(ln) }()
		e.tb.Cleanup(gs.Stop)
		if err := o.SetWorkflow(controlWorkflowSpec(), true, ""); err != nil {
			e.tb.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- o.Run(runCtx) }()
		e.tb.Cleanup(func() { cancel(); <-done })
		e.o = o

		for _, pod := range []string{"map", "reduce"} {
			tok := filepath.Join(dir, pod+".token")
			if err := os.WriteFile(tok, []byte(secret+":"+pod), 0o600); err != nil {
				e.tb.Fatal(err)
			}
			fport, listen := servers.FreePort(e.tb), fmt.Sprintf("127.0.0.1:%d", servers.FreePort(e.tb))
			sc := runSidecar(e.tb, cfg.Sidecar.Binary, dir, pod, keys, append(tierEnv(cfg), "ZIPTRAIL_OPERATOR_ADDR="+ln.Addr().String(),
				"ZIPTRAIL_TOKEN_FILE="+tok, "ZIPTRAIL_WORKFLOW="+controlWorkflow, "ZIPTRAIL_FUNCTION="+pod), listen, fmt.Sprintf("http://127.0.0.1:%d", fport))
			e.sidecars = append(e.sidecars, sc)
			fn := startPython(e.tb, cfg.Sidecar.Python, dir, pod+"-sdkfunc.py", sdkFuncPy,
				[]string{fmt.Sprintf("PORT=%d", fport), "ZIPTRAIL_SOCKET=" + sc.socket, "ZIPTRAIL_SHM_DIR=" + sc.shm})
			e.funcs = append(e.funcs, fn)
			// serving once its port accepts (bounded poll: Python starts
			// slowly on a busy machine)
			for deadline := time.Now().Add(2 * time.Minute); ; {
				if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", fport)); err == nil {
					c.Close()
					break
				}
				select {
				case <-fn.done:
					e.tb.Fatalf("the Python function server of pod %s exited\n%s", pod, fn.log.String())
				case <-time.After(50 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					e.tb.Fatalf("the Python function server of pod %s is not serving on port %d after 2 minutes\n%s", pod, fport, fn.log.String())
				}
			}
			u, _ := url.Parse("http://" + listen)
			if pod == "map" {
				rt["split"], rt["map"] = u, u
			} else {
				rt["reduce"], rt["collect"] = u, u
			}
		}
	})
	if err != nil {
		return nil, err
	}
	// a first session: connections, control streams, the Python servers
	// up (bounded by its deadline)
	if _, err := e.session(ctx, ControlPoint{Maps: 2, ObjectsPerMap: 4, Groups: 2}); err != nil {
		return nil, fmt.Errorf("warm-up session: %w", err)
	}
	c0, err := e.cpu()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	select {
	case <-time.After(max(cfg.DurationPerPoint, time.Second)):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c1, err := e.cpu()
	if err != nil {
		return nil, err
	}
	for i := range e.idle {
		e.idle[i] = (c1[i] - c0[i]) / time.Since(t0).Seconds()
	}
	return e, nil
}

func (e *controlEnv) close() { e.tb.Close() }

// funcLog is the end of the function servers' stderr.
func (e *controlEnv) funcLog() string {
	var out []string
	for _, f := range e.funcs {
		l := f.log.String()
		out = append(out, l[max(0, len(l)-2000):])
	}
	return strings.Join(out, "\n---\n")
}

// cpu is the CPU seconds of the engine (this process), the sidecars, the
// store and the functions.
func (e *controlEnv) cpu() ([4]float64, error) {
	var c [4]float64
	c[0] = selfCPU()
	for _, p := range e.sidecars {
		v, err := ProcessCPU(p.cmd.Process.Pid)
		if err != nil {
			return c, err
		}
		c[1] += v
	}
	v, err := ProcessCPU(e.redisPID)
	if err != nil {
		return c, err
	}
	c[2] = v
	for _, p := range e.funcs {
		v, err := ProcessCPU(p.cmd.Process.Pid)
		if err != nil {
			return c, err
		}
		c[3] += v
	}
	return c, nil
}

// session runs one session of shape cp to its end.
func (e *controlEnv) session(ctx context.Context, cp ControlPoint) (sessions.Session, error) {
	in, _ := json.Marshal(map[string]any{"maps": cp.Maps, "objects": cp.ObjectsPerMap, "groups": cp.Groups, "hold": cp.Hold.Seconds(),
		"ticks": holdTicks(cp.Hold), "tick": holdTick.Seconds()})
	id, err := e.o.StartSession(ctx, "calibrate", controlWorkflow, in)
	if err != nil {
		return sessions.Session{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	s, err := e.o.Sessions().Wait(wctx, id)
	if err != nil {
		// say how far it got
		if st, gerr := e.o.Sessions().Get(id); gerr == nil {
			var evs []string
			for _, ev := range st.Events[max(0, len(st.Events)-8):] {
				evs = append(evs, ev.Kind+": "+ev.Message)
			}
			err = fmt.Errorf("session %s (%s): %w; last events: %s; functions' log: %s", id, st.State, err, strings.Join(evs, "; "), e.funcLog())
		}
		return s, err
	}
	if s.State != sessions.Completed {
		return s, fmt.Errorf("session %s ended %s: %s; functions' log: %s", id, s.State, s.Error, e.funcLog())
	}
	return s, nil
}

// controlPoint runs one control-path session and records its CPU.
func (r *runner) controlPoint(ctx context.Context, cp ControlPoint) (string, error) {
	if r.control == nil {
		var err error
		if r.control, err = r.startControl(ctx); err != nil {
			return "", err
		}
	}
	e := r.control
	c0, err := e.cpu()
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	if _, err := e.session(ctx, cp); err != nil {
		return "", err
	}
	secs := time.Since(t0).Seconds()
	c1, err := e.cpu()
	if err != nil {
		return "", err
	}
	var d [4]float64
	for i := range d {
		d[i] = max(0, c1[i]-c0[i]-e.idle[i]*secs)
	}
	ticks := holdTicks(cp.Hold)
	s := ControlSample{ControlPoint: cp, Objects: cp.Maps*cp.ObjectsPerMap + cp.Groups + 1 + ticks, Sends: cp.Maps*cp.ObjectsPerMap + ticks,
		Invocations: 1 + cp.Maps + cp.Groups + 1, Seconds: secs, EngineCPU: d[0], SidecarCPU: d[1], StoreCPU: d[2], FunctionCPU: d[3], IdleCores: e.idle}
	s.ObjectSeconds = float64(s.Objects) * (cp.Hold.Seconds() + max(0, secs-cp.Hold.Seconds())/2)
	r.m.Control = append(r.m.Control, s)
	return fmt.Sprintf("%d objects, %d invocations in %.2fs; CPU: engine %.2fs, sidecars %.2fs, redis %.2fs, Python functions %.2fs (idle: %.3f, %.3f, %.3f, %.3f cores, subtracted)",
		s.Objects, s.Invocations, secs, s.EngineCPU, s.SidecarCPU, s.StoreCPU, s.FunctionCPU, e.idle[0], e.idle[1], e.idle[2], e.idle[3]), nil
}
