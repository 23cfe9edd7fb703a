package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/tools/chartops"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
	"github.com/ziptrail/ziptrail/sdk/go/admin"
)

const (
	release   = "ziptrail"
	namespace = "chaos" // the workflows'
	// The sharded mode's engine, as e2e/helm's sharded spec installs it.
	shardedBuckets  = 6
	shardedReplicas = 3
	// Both modes' engine Leases (the unsharded leader's, the sharded
	// buckets'): with the chart's default of 15 s, a replica SIGKILLed every
	// 20 s would keep the engine away most of the time; an operator who
	// expects a crash that often sets engine.leaseDuration so.
	engineLease = 6 * time.Second
)

// modeRun is one mode's run: the chart installed, the workflows, the
// sessions and the nemeses, and the checker's verdict.
type modeRun struct {
	cfg     config
	mode    string
	cluster *localcluster.Cluster
	rel     *chartops.Release
	gw      *admin.Client
	out     io.Writer
	log     io.Writer
	rng     *rand.Rand
	rngMu   sync.Mutex
	effects string
	last    bool // the run's last mode

	mu       sync.Mutex
	sessions []*sessionRun
	phase    int
	inFlight int
	skipped  map[int]int // starts skipped at maxInFlight, by phase
	phases   []string
	faults   []fault
}

// fault is one act of a nemesis.
type fault struct {
	at    time.Time
	phase int
	what  string
	err   error
}

func (m *modeRun) sharded() bool { return m.mode == "sharded" }

func (m *modeRun) intn(n int) int {
	m.rngMu.Lock()
	defer m.rngMu.Unlock()
	return m.rng.IntN(n)
}

// jitter is d ± frac of it.
func (m *modeRun) jitter(d time.Duration, frac float64) time.Duration {
	m.rngMu.Lock()
	defer m.rngMu.Unlock()
	return d + time.Duration((m.rng.Float64()*2-1)*frac*float64(d))
}

func (m *modeRun) step(format string, args ...any) {
	fmt.Fprintf(m.out, "==> [%s] "+format+"\n", append([]any{m.mode}, args...)...)
}

// run installs the chart, runs the phases and checks; it returns the
// number of violations and the mode's table.
func (m *modeRun) run(ctx context.Context) (int, string, error) {
	t := time.Now()
	c := m.cluster
	m.rel = &chartops.Release{Name: release, Namespace: localcluster.SystemNamespace, Kubeconfig: c.Kubeconfig,
		Clientset: c.Clientset, Log: m.log}
	values := append(c.HelmValues(), "engine.leaseDuration="+engineLease.String(), "engine.renewDeadline=5s", "engine.retryPeriod=1s")
	if m.sharded() {
		values = append(values, "engine.sharded=true", fmt.Sprintf("engine.buckets=%d", shardedBuckets),
			fmt.Sprintf("operator.replicas=%d", shardedReplicas))
	}
	m.step("helm install %s (%s)", release, m.describeInstall())
	if err := m.rel.Install(ctx, values...); err != nil {
		return 0, "", err
	}
	if !m.last {
		// The next mode installs afresh; after the last one, the cluster's
		// teardown removes everything at once.
		defer m.uninstall()
	}
	// Every operator container's log, kept after a run with violations or
	// a setup that failed: what a stuck session is understood from.
	logDir := filepath.Join(os.TempDir(), fmt.Sprintf("ziptrail-chaos-%d-%s-operator", os.Getpid(), m.mode))
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return 0, "", err
	}
	fctx, stopFollowing := context.WithCancel(ctx)
	waitFollowing := m.followOperatorLogs(fctx, logDir)
	keepLogs := true // removed after a run without violations
	defer func() {
		stopFollowing()
		waitFollowing()
		if !keepLogs {
			_ = os.RemoveAll(logDir)
		}
	}()
	if err := m.applyWorkflows(ctx); err != nil {
		return 0, "", err
	}
	_, grpcAddr, err := m.rel.Gateway(ctx)
	if err != nil {
		return 0, "", err
	}
	token, err := chartops.RunnerToken(ctx, c.Clientset, namespace, "chaos-runner", 3*time.Hour)
	if err != nil {
		return 0, "", err
	}
	if m.gw, err = admin.New(c.Config, admin.Options{Namespace: namespace, Gateway: grpcAddr, GatewayToken: token}); err != nil {
		return 0, "", err
	}
	defer m.gw.Close()
	// Every shape once, undisturbed: the workload itself must be right.
	for _, sh := range shapes {
		s := m.session(ctx, sh, "warmup-"+sh.name, -1)
		if s.outcome != outcomeOK {
			m.dumpOperator(ctx)
			return 0, "", fmt.Errorf("the %s workflow does not work without faults: %s %s (the operator's pods and logs above)", sh.name, s.outcome, s.detail)
		}
	}
	m.step("ready in %s (install, workflows Ready, one session of each shape)", time.Since(t).Round(time.Second))

	m.phases = append([]string{"none"}, m.cfg.nemeses...)
	m.skipped = map[int]int{}
	m.runPhases(ctx)
	m.explainStuck(ctx, logDir)
	v, table := m.check()
	keepLogs = v > 0 || ctx.Err() != nil
	return v, table, ctx.Err()
}

func (m *modeRun) describeInstall() string {
	if m.sharded() {
		return fmt.Sprintf("sharded engine: %d replicas, %d buckets, Leases %s; Redis checkpoints", shardedReplicas, shardedBuckets, engineLease)
	}
	return fmt.Sprintf("unsharded engine: 2 replicas, leader election, Lease %s; Redis checkpoints", engineLease)
}

// applyWorkflows creates the namespace and one Workflow per shape, and
// waits until they are Ready.
func (m *modeRun) applyWorkflows(ctx context.Context) error {
	k := m.cluster.Client
	if err := client.IgnoreAlreadyExists(k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})); err != nil {
		return err
	}
	for _, sh := range shapes {
		wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: sh.name}, Spec: sh.spec(work{effects: m.effects, max: m.cfg.work})}
		// A deadline past the checker's: the checker, not the engine, says
		// stuck.
		wf.Spec.SessionDeadline = &metav1.Duration{Duration: 2 * m.cfg.sessionDeadline}
		if err := k.Create(ctx, wf); err != nil {
			return fmt.Errorf("workflow %s: %w", sh.name, err)
		}
	}
	deadline := time.Now().Add(6 * time.Minute)
	for _, sh := range shapes {
		for pause := 200 * time.Millisecond; ; pause = min(2*pause, 2*time.Second) {
			wf := &v1alpha1.Workflow{}
			err := k.Get(ctx, client.ObjectKey{Namespace: namespace, Name: sh.name}, wf)
			if err == nil {
				if c := meta.FindStatusCondition(wf.Status.Conditions, "Ready"); c != nil && c.Status == metav1.ConditionTrue {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("workflow %s not Ready after 6m (%v): %+v", sh.name, err, wf.Status.Conditions)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(pause):
			}
		}
	}
	return nil
}

// uninstall deletes the workflows (their finalizer is the operator's) and
// the release, so that the next mode installs afresh.
func (m *modeRun) uninstall() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	k := m.cluster.Client
	for _, sh := range shapes {
		_ = k.Delete(ctx, &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: sh.name}})
	}
	for _, sh := range shapes {
		for pause := 200 * time.Millisecond; ; pause = min(2*pause, 2*time.Second) {
			err := k.Get(ctx, client.ObjectKey{Namespace: namespace, Name: sh.name}, &v1alpha1.Workflow{})
			if apierrors.IsNotFound(err) || ctx.Err() != nil {
				break
			}
			time.Sleep(pause)
		}
	}
	if err := m.rel.Uninstall(ctx); err != nil {
		fmt.Fprintf(m.out, "warning: %v\n", err)
	}
	m.step("workflows deleted and helm uninstall %s in %s", release, time.Since(t0).Round(time.Second))
}

// runPhases runs the workers across every phase and each phase's nemesis,
// with a progress line every cfg.progress; it returns once every session
// has its verdict.
func (m *modeRun) runPhases(ctx context.Context) {
	phaseLen := m.cfg.duration / time.Duration(len(m.phases))
	start := time.Now()
	end := start.Add(m.cfg.duration)
	m.step("%d phases of %s: %v", len(m.phases), phaseLen.Round(time.Second), m.phases)

	// Open loop: a session starts every 1/rate whatever the others do (a
	// stuck session does not slow the arrivals down), up to maxInFlight at
	// once; a start skipped at that bound is counted.
	wctx, stopWorkers := context.WithCancel(ctx)
	var workers sync.WaitGroup
	workers.Add(1)
	go func() {
		defer workers.Done()
		tick := time.NewTicker(time.Duration(float64(time.Second) / m.cfg.rate))
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			if !time.Now().Before(end) {
				return
			}
			m.mu.Lock()
			phase := m.phase
			if m.inFlight >= m.cfg.maxInFlight {
				m.skipped[phase]++
				m.mu.Unlock()
				continue
			}
			m.inFlight++
			m.mu.Unlock()
			sh := shapes[n%len(shapes)]
			workers.Add(1)
			go func() {
				defer workers.Done()
				// A session runs to its verdict even past the end.
				s := m.session(context.WithoutCancel(wctx), sh, fmt.Sprintf("%s-%d", sh.name, n), phase)
				m.mu.Lock()
				m.inFlight--
				m.sessions = append(m.sessions, s)
				m.mu.Unlock()
			}()
		}
	}()

	progress := time.NewTicker(m.cfg.progress)
	defer progress.Stop()
	for i, name := range m.phases {
		m.mu.Lock()
		m.phase = i
		m.mu.Unlock()
		pend := start.Add(time.Duration(i+1) * phaseLen)
		if i == len(m.phases)-1 {
			pend = end
		}
		m.step("phase %d/%d: %s until %s", i+1, len(m.phases), name, pend.Format("15:04:05"))
		nctx, stopNemesis := context.WithDeadline(ctx, pend)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if n := nemesisByName(name); n != nil {
				n.run(nctx, m, i, phaseLen)
			} else {
				<-nctx.Done()
			}
		}()
	wait:
		for {
			select {
			case <-done:
				break wait
			case <-progress.C:
				m.printProgress(start)
			}
		}
		stopNemesis()
		if ctx.Err() != nil {
			break
		}
	}
	stopWorkers()
	// The sessions in flight finish or reach their deadline.
	finished := make(chan struct{})
	go func() { workers.Wait(); close(finished) }()
	for {
		select {
		case <-finished:
			m.printProgress(start)
			return
		case <-progress.C:
			m.printProgress(start)
		}
	}
}

func (m *modeRun) printProgress(start time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	counts := map[outcome]int{}
	for _, s := range m.sessions {
		counts[s.outcome]++
	}
	last := "none yet"
	if n := len(m.faults); n > 0 {
		f := m.faults[n-1]
		last = fmt.Sprintf("%s %s ago", f.what, time.Since(f.at).Round(time.Second))
		if f.err != nil {
			last += " (error: " + f.err.Error() + ")"
		}
	}
	fmt.Fprintf(m.out, "    [%s %s] phase %s: %d sessions done, %d in flight (ok %d, wrong %d, lost %d, stuck %d, no start %d); faults %d, last: %s\n",
		m.mode, time.Since(start).Round(time.Second), m.phases[m.phase], len(m.sessions), m.inFlight, counts[outcomeOK], counts[outcomeWrong],
		counts[outcomeLost], counts[outcomeStuck], counts[outcomeNoStart], len(m.faults), last)
}

func (m *modeRun) recordFault(phase int, what string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults = append(m.faults, fault{at: time.Now(), phase: phase, what: what, err: err})
	if err != nil {
		fmt.Fprintf(m.log, "%s fault %s: %v\n", time.Now().Format(time.RFC3339Nano), what, err)
	}
}

// outcome is a session's verdict.
type outcome string

const (
	outcomeOK      outcome = "ok"
	outcomeWrong   outcome = "wrong"    // completed with a result other than its expected set, or Failed
	outcomeLost    outcome = "lost"     // acknowledged (201), then unknown to the gateway
	outcomeStuck   outcome = "stuck"    // no final answer by its deadline (or Expired)
	outcomeNoStart outcome = "no start" // no start acknowledged by its deadline
)

// sessionRun is one session as the client saw it.
type sessionRun struct {
	shape, input, id string
	phase            int
	started          time.Time
	took             time.Duration
	outcome          outcome
	detail           string
	retries          int // client calls retried (unavailable gateway)
}

// session runs one session of sh: start (retrying what the gateway
// answers unavailable), wait for the result (same), check it — all within
// the session deadline.
func (m *modeRun) session(ctx context.Context, sh shape, input string, phase int) *sessionRun {
	s := &sessionRun{shape: sh.name, input: input, phase: phase, started: time.Now()}
	ctx, cancel := context.WithDeadline(ctx, s.started.Add(m.cfg.sessionDeadline))
	defer cancel()
	defer func() { s.took = time.Since(s.started) }()
	pause := 100 * time.Millisecond
	backoff := func() bool {
		s.retries++
		select {
		case <-ctx.Done():
			return false
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Second)
		return true
	}
	var lastErr error
	for s.id == "" {
		st, err := m.gw.StartSession(ctx, sh.name, []byte(input))
		if err == nil {
			s.id = st.ID
			break
		}
		lastErr = err
		if !errors.Is(err, ziptrail.ErrUnavailable) || !backoff() {
			s.outcome, s.detail = outcomeNoStart, err.Error()
			if ctx.Err() != nil && lastErr != nil {
				s.detail = "last: " + lastErr.Error()
			}
			return s
		}
	}
	pause = 100 * time.Millisecond
	for {
		r, err := m.gw.Wait(ctx, s.id)
		switch {
		case err == nil:
			if cerr := sh.check(input, string(r.Output)); cerr != nil {
				s.outcome, s.detail = outcomeWrong, cerr.Error()
			} else {
				s.outcome = outcomeOK
			}
			return s
		case errors.Is(err, ziptrail.ErrFunctionFailed):
			s.outcome, s.detail = outcomeWrong, err.Error()
			return s
		case errors.Is(err, ziptrail.ErrNotFound):
			s.outcome, s.detail = outcomeLost, err.Error()
			return s
		case errors.Is(err, ziptrail.ErrExpired):
			s.outcome, s.detail = outcomeStuck, err.Error()
			return s
		case errors.Is(err, ziptrail.ErrUnavailable) && backoff():
			lastErr = err
		default:
			s.outcome, s.detail = outcomeStuck, err.Error()
			if lastErr != nil {
				s.detail += " (last retried: " + lastErr.Error() + ")"
			}
			return s
		}
	}
}

// dumpOperator writes the operator's pods, their leader label and Lease,
// and the last lines of their logs (the restarted containers' too) to the
// output and the run's log: what a setup that does not work needs to be
// understood.
func (m *modeRun) dumpOperator(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	// Printed too: a CI log is often all there is of a failed run.
	w := io.MultiWriter(m.out, m.log)
	ns := localcluster.SystemNamespace
	out, _ := m.rel.Kubectl(ctx, "-n", ns, "get", "pods,leases,endpointslices", "-o", "wide", "--show-labels")
	fmt.Fprintf(w, "--- the operator's pods, Leases and endpoints\n%s\n", out)
	pods, err := m.rel.OperatorPods(ctx)
	if err != nil {
		fmt.Fprintf(w, "--- the operator's pods: %v\n", err)
		return
	}
	for _, p := range pods {
		for _, prev := range []bool{true, false} {
			out, _ := m.rel.Kubectl(ctx, "-n", ns, "logs", p.Name, "--tail", "120", fmt.Sprintf("--previous=%v", prev))
			fmt.Fprintf(w, "--- logs of %s (previous container: %v)\n%s\n", p.Name, prev, out)
		}
	}
}
