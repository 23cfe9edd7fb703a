package helm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
	"github.com/ziptrail/ziptrail/sdk/go/admin"
)

// An operator rollout (issue 32): the chart's operator with its defaults
// (2 replicas, leader election) and Redis for the engine's checkpoints runs
// a workflow of two Python functions joined by a `dependencies` edge, with
// no re-execution rule: sleeper sleeps rolloutSleep, then finish. Sessions
// started through the session gateway with the Go admin client (as
// `ziptrail run` does) run through `kubectl rollout restart` of the
// operator's Deployment, started a few seconds into them, and then through
// a `helm upgrade` that changes a harmless value (a new ReplicaSet): every
// one completes with its right result. Its own release, installed and
// uninstalled here (like the sharded and noisy Describes).
//
// Run it alone:
//
//	go test ./e2e/helm -run TestHelm -timeout 60m -count=1 -v -ginkgo.focus "rollout"
const (
	rolloutWF       = "rollout"
	rolloutSleep    = 15 * time.Second
	rolloutSessions = 5
	// rolloutChangeAfter is how far into the sessions the rollout starts.
	rolloutChangeAfter = 4 * time.Second
	// rolloutGrace is how long after the rollout finished every session
	// must have its result: sleeper's rest, finish, and a new leader's
	// takeover fit in it many times over.
	rolloutGrace = 2 * time.Minute
)

// ContinueOnFailure: the helm upgrade phase runs (and says what it sees)
// even when the restart phase failed.
var _ = Describe("operator rollout: sessions in flight complete through `kubectl rollout restart` and `helm upgrade`", Ordered, ContinueOnFailure, func() {
	var (
		installed, uninstalled, createdNS bool
		gwc                               *admin.Client
	)

	AfterEach(func() {
		if !CurrentSpecReport().Failed() {
			return
		}
		for _, p := range operatorPods() {
			GinkgoWriter.Printf("--- operator pod %s ip %s phase %s ready %v restarts %d labels %v\n", p.Name, p.Status.PodIP, p.Status.Phase, podReady(p), restarts(p), p.Labels)
			if out, err := kubectlRun("", "-n", releaseNS, "logs", p.Name, "--tail", "80"); err == nil {
				GinkgoWriter.Printf("%s\n", out)
			}
		}
	})

	BeforeAll(func() {
		for _, ns := range []string{releaseNS, wfNS} {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			if ns == wfNS && err == nil {
				createdNS = true
			}
			Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
		}
		hostRedis()
	})

	AfterAll(func() {
		if gwc != nil {
			_ = gwc.Close()
		}
		if installed && !uninstalled { // a spec failed before the uninstall: leave the cluster to the other specs
			wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: wfNS, Name: rolloutWF}}
			_ = k8s.Delete(ctx, wf)
			for end := time.Now().Add(2 * time.Minute); time.Now().Before(end) && !apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(wf), wf)); {
				time.Sleep(time.Second)
			}
			out, err := helm("uninstall", release, "-n", releaseNS, "--wait", "--timeout", "10m")
			GinkgoWriter.Printf("cleanup: helm uninstall: %v %s\n", err, out)
		}
		if createdNS { // the other Describes create it too
			Expect(client.IgnoreNotFound(cs.CoreV1().Namespaces().Delete(ctx, wfNS, metav1.DeleteOptions{}))).To(Succeed())
			Eventually(func() bool {
				_, err := cs.CoreV1().Namespaces().Get(ctx, wfNS, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			}, "5m").Should(BeTrue())
		}
	})

	It("installs with the defaults (2 replicas, leader election) and Redis for the engine's checkpoints", func() {
		installed = true // from here on, AfterAll uninstalls if a spec fails
		out, err := helm("install", release, chart, "-n", releaseNS, "--create-namespace",
			"--set", "tiers.redis.address="+redisAddress, "--wait", "--timeout", "10m")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("STATUS: deployed"))
		waitOperatorRolledOut()
	})

	It("runs a sleeper -> finish session undisturbed (the baseline)", func() {
		applyWorkflow(rolloutWF, rolloutWorkflow())
		var err error
		gwc, err = admin.New(cluster.Config, admin.Options{Namespace: wfNS, Gateway: gatewayGRPCAddr(), GatewayToken: sessionToken()})
		Expect(err).NotTo(HaveOccurred())
		t := time.Now()
		s, err := gwc.StartSession(ctx, rolloutWF, []byte("baseline"))
		Expect(err).NotTo(HaveOccurred())
		wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		r, err := gwc.Wait(wctx, s.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(r.Output)).To(Equal(rolloutWant("baseline")))
		AddReportEntry("baseline", fmt.Sprintf("session %s completed in %s", s.ID, time.Since(t).Round(time.Millisecond)))
	})

	It("completes every session through `kubectl rollout restart deploy/"+release+"-operator`", func() {
		rolloutPhase(gwc, "restart", func() {
			out, err := kubectlRun("", "-n", releaseNS, "rollout", "restart", "deploy/"+release+"-operator")
			Expect(err).NotTo(HaveOccurred(), out)
			out, err = kubectlRun("", "-n", releaseNS, "rollout", "status", "deploy/"+release+"-operator", "--timeout", "5m")
			Expect(err).NotTo(HaveOccurred(), out)
		})
	})

	It("completes every session through `helm upgrade` (a changed value: a new ReplicaSet)", func() {
		rolloutPhase(gwc, "upgrade", func() {
			out, err := helm("upgrade", release, chart, "-n", releaseNS, "--reuse-values",
				"--set", "operator.logLevel=debug", "--wait", "--timeout", "10m")
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(out).To(ContainSubstring("STATUS: deployed"))
		})
		d, err := cs.AppsV1().Deployments(releaseNS).Get(ctx, release+"-operator", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(d.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--zap-log-level=debug"))
	})

	It("uninstalls", func() {
		deleteWorkflow(rolloutWF)
		out, err := helm("uninstall", release, "-n", releaseNS, "--wait", "--timeout", "10m")
		Expect(err).NotTo(HaveOccurred(), out)
		uninstalled = true
		Eventually(func(g Gomega) { g.Expect(operatorPods()).To(BeEmpty()) }).Should(Succeed())
	})
})

// rolloutWorkflow: sleeper (sleeps rolloutSleep) -> finish, in the
// function-oriented form (a dependencies edge; each return value is the
// next one's input, finish's the session's result), no re-execution rule.
// One warm pod each: the sessions measure the operator, not cold starts.
func rolloutWorkflow() v1alpha1.WorkflowSpec {
	one := int32(1)
	sleeper := pyFunction("sleeper", "import time", fmt.Sprintf(`
def handle(inv):
    time.sleep(%d)
    return inv.objects[0].bytes() + b"|slept"`, int(rolloutSleep.Seconds())))
	finish := pyFunction("finish", "", `
def handle(inv):
    return inv.objects[0].bytes() + b"|finished"`)
	sleeper.MinScale, finish.MinScale = &one, &one
	return v1alpha1.WorkflowSpec{Entry: "sleeper", Functions: []v1alpha1.FunctionSpec{sleeper, finish},
		Dependencies: []v1alpha1.Dependency{{From: []string{"sleeper"}, To: []string{"finish"}}}}
}

func rolloutWant(input string) string { return input + "|slept|finished" }

// waitOperatorRolledOut waits until the operator's Deployment runs its
// current template on every replica, with one leader behind the gateway.
func waitOperatorRolledOut() {
	Eventually(func(g Gomega) {
		rolledOut(g, releaseNS, release+"-operator")
		leader(g)
	}, "5m").Should(Succeed())
}

// rolloutSession is one session of a phase as its client saw it.
type rolloutSession struct {
	input, id string
	started   time.Time
	took      time.Duration
	output    string
	err       error
	// retried are the admin client's errors that its caller retried
	// (connection refused, no ready endpoint): a rollout should not show
	// them to a user.
	retried []string
}

// rolloutPhase starts rolloutSessions sessions with the admin client,
// runs change rolloutChangeAfter into them (it returns once the rollout
// finished), and requires every session to complete with its right result
// within rolloutGrace after that.
func rolloutPhase(gwc *admin.Client, phase string, change func()) {
	waitOperatorRolledOut()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	runs := make([]*rolloutSession, rolloutSessions)
	var wg sync.WaitGroup
	for i := range runs {
		r := &rolloutSession{input: fmt.Sprintf("%s-%d", phase, i)}
		runs[i] = r
		wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			r.run(wctx, gwc)
		}()
	}
	old := map[types.UID]bool{}
	for _, p := range operatorPods() {
		old[p.UID] = true
	}
	time.Sleep(rolloutChangeAfter)
	t := time.Now()
	change()
	// Rolled out: every pod is of the new template, Ready, one leader.
	Eventually(func(g Gomega) {
		rolledOut(g, releaseNS, release+"-operator")
		for _, p := range operatorPods() {
			g.Expect(old).NotTo(HaveKey(p.UID), "pod %s is of the old ReplicaSet", p.Name)
		}
		leader(g)
	}, "5m").Should(Succeed())
	rolled := time.Since(t)
	GinkgoWriter.Printf("%s: the operator rolled out in %s; waiting up to %s for the sessions\n", phase, rolled.Round(time.Millisecond), rolloutGrace)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(rolloutGrace):
		stop()
		<-done
	}

	var wrong, retried []string
	var summary strings.Builder
	fmt.Fprintf(&summary, "%s: %d sessions, the rollout began %s into them and took %s:\n", phase, len(runs), rolloutChangeAfter, rolled.Round(time.Millisecond))
	for _, r := range runs {
		state := r.describe(gwc)
		fmt.Fprintf(&summary, "  %s\n", state)
		if r.err != nil || r.output != rolloutWant(r.input) {
			wrong = append(wrong, state)
		}
		retried = append(retried, r.retried...)
	}
	AddReportEntry(phase, summary.String())
	GinkgoWriter.Printf("%s", summary.String())
	Expect(wrong).To(BeEmpty(), "every session completes with its result through the rollout\n%s", summary.String())
	Expect(retried).To(BeEmpty(), "the admin client hides the rollout from its caller (as `ziptrail run` must)")
}

// run starts the session (retrying what did not reach an operator) and
// waits for its result until ctx ends.
func (r *rolloutSession) run(ctx context.Context, gwc *admin.Client) {
	r.started = time.Now()
	defer func() { r.took = time.Since(r.started) }()
	pause := 200 * time.Millisecond
	for r.id == "" {
		s, err := gwc.StartSession(ctx, rolloutWF, []byte(r.input))
		switch {
		case err == nil:
			r.id = s.ID
		case errors.Is(err, ziptrail.ErrUnavailable) && ctx.Err() == nil:
			r.retried = append(r.retried, "start: "+err.Error())
			time.Sleep(pause)
			pause = min(2*pause, 2*time.Second)
		default:
			r.err = fmt.Errorf("start: %w", err)
			return
		}
	}
	for {
		res, err := gwc.Wait(ctx, r.id)
		switch {
		case err == nil:
			r.output, r.err = string(res.Output), nil
			return
		case errors.Is(err, ziptrail.ErrUnavailable) && ctx.Err() == nil:
			r.retried = append(r.retried, "wait: "+err.Error())
			time.Sleep(pause)
			pause = min(2*pause, 2*time.Second)
		default:
			r.err = err
			return
		}
	}
}

// describe is one line on the session: its outcome and what the gateway
// says of it now.
func (r *rolloutSession) describe(gwc *admin.Client) string {
	line := fmt.Sprintf("session %q (%s) after %s: ", r.input, r.id, r.took.Round(time.Millisecond))
	switch {
	case r.err != nil:
		line += "error: " + r.err.Error()
	case r.output != rolloutWant(r.input):
		line += fmt.Sprintf("result %q, want %q", r.output, rolloutWant(r.input))
	default:
		line += "completed, " + r.output
	}
	if r.id != "" && (r.err != nil || r.output != rolloutWant(r.input)) {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if s, err := gwc.GetSession(gctx, r.id); err == nil {
			line += fmt.Sprintf(" [now %s, %d invocations, %d objects, started %s ago]", s.State, s.Invocations, s.Objects, time.Since(s.Started).Round(time.Second))
		} else {
			line += fmt.Sprintf(" [get session: %v]", err)
		}
	}
	if len(r.retried) > 0 {
		line += fmt.Sprintf(" (%d client errors retried, first: %s)", len(r.retried), r.retried[0])
	}
	return line
}
