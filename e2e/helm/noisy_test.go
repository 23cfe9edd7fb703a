package helm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// Noisy neighbours (issue 31): namespace A floods what every namespace
// shares — session starts over its limits, oversized and unauthenticated
// gRPC bodies to the session gateway, forged references through
// activator-ext — while namespace B runs a steady stream of word-count
// sessions. B's sessions all complete with the right count, B's p99 during
// the flood stays within 2x of its p99 without it (both measured here, one
// after the other), and neither the operator nor the activator restarts.
// Its own release (installed and uninstalled here, like the sharded
// Describe's).

const (
	noisyA = "zt-noisy-a" // the flooding tenant
	noisyB = "zt-noisy-b" // the steady tenant
	// The limits (each namespace's), small enough for A's flood to reach
	// them at once; B, one session at a time (3 requests each, a session
	// ~25 ms: ~120 requests a second), stays well under the rate, which
	// A's flood (a refusal is well under a millisecond) passes many times.
	noisySessions = 4
	noisyRPS      = 400
	// B's sessions a phase (baseline, flood): p99 is then the 297th, so
	// that it is not one or two sessions a host whose CPUs B's own
	// sessions keep ~95 % busy delays now and then, in either phase (with
	// 100, p99 was the second slowest, and two ~90 ms sessions among
	// ~15 ms ones decided the spec; a phase takes ~6 s).
	noisyRuns = 300
)

var _ = Describe("noisy neighbours: one namespace floods, another's word counts keep their latency", Ordered, func() {
	var (
		installed, uninstalled bool
		text                   []byte
		baseline               []time.Duration
	)

	AfterEach(func() {
		if !CurrentSpecReport().Failed() {
			return
		}
		for _, p := range operatorPods() {
			if out, err := kubectlRun("", "-n", releaseNS, "logs", p.Name, "--tail", "60"); err == nil {
				GinkgoWriter.Printf("--- operator pod %s (restarts %d)\n%s\n", p.Name, restarts(p), out)
			}
		}
	})

	BeforeAll(func() {
		for _, ns := range []string{noisyA, noisyB} {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
		}
		var err error
		text, err = os.ReadFile(filepath.Join(paths.RepoRoot(), "LICENSE"))
		Expect(err).NotTo(HaveOccurred())
	})

	AfterAll(func() {
		for _, ns := range []string{noisyA, noisyB} {
			var wfs v1alpha1.WorkflowList
			if k8s.List(ctx, &wfs, client.InNamespace(ns)) == nil {
				for i := range wfs.Items {
					_ = k8s.Delete(ctx, &wfs.Items[i])
				}
				Eventually(func(g Gomega) {
					var left v1alpha1.WorkflowList
					g.Expect(k8s.List(ctx, &left, client.InNamespace(ns))).To(Succeed())
					g.Expect(left.Items).To(BeEmpty())
				}, "3m").Should(Succeed())
			}
		}
		if installed && !uninstalled {
			out, err := helm("uninstall", release, "-n", releaseNS, "--wait", "--timeout", "10m")
			GinkgoWriter.Printf("cleanup: helm uninstall: %v %s\n", err, out)
		}
		for _, ns := range []string{noisyA, noisyB} {
			Expect(client.IgnoreNotFound(cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}))).To(Succeed())
		}
		for _, ns := range []string{noisyA, noisyB} {
			Eventually(func() bool {
				_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			}, "5m").Should(BeTrue())
		}
	})

	It("installs with activator-ext and small per-namespace limits", func() {
		installed = true
		args := []string{"install", release, chart, "-n", releaseNS, "--create-namespace",
			"--set", "activatorExt.enabled=true",
			"--set", fmt.Sprintf("limits.sessionsPerNamespace=%d", noisySessions),
			"--set", fmt.Sprintf("limits.requestsPerSecond=%d", noisyRPS), "--set", fmt.Sprintf("limits.requestBurst=%d", noisyRPS),
			"--wait", "--timeout", "10m"}
		if profileDir() != "" {
			args = append(args, "--set", fmt.Sprintf("operator.pprofPort=%d", pprofPort))
		}
		out, err := helm(args...)
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(func(g Gomega) {
			rolledOut(g, releaseNS, release+"-operator")
			d := rolledOut(g, knNS, "activator")
			g.Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal(activatorImage))
		}, "6m").Should(Succeed())
	})

	It("runs B's word count and A's workflows", func() {
		// The sample as it is, but with its pods' number fixed: a cold start
		// in one phase and not the other would measure Knative's autoscaler
		// (this suite scales to zero within seconds), not A's flood.
		data, err := os.ReadFile(filepath.Join(paths.RepoRoot(), "examples", "wordcount", "workflow.yaml"))
		Expect(err).NotTo(HaveOccurred())
		wc := &v1alpha1.Workflow{}
		Expect(yaml.UnmarshalStrict(data, wc)).To(Succeed())
		wc.Namespace = noisyB
		for i := range wc.Spec.Functions {
			one := int32(1)
			wc.Spec.Functions[i].MinScale, wc.Spec.Functions[i].MaxScale = &one, &one
		}
		Expect(k8s.Create(ctx, wc)).To(Succeed())
		Expect(k8s.Create(ctx, &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: noisyA, Name: "hold"}, Spec: holdWorkflow()})).To(Succeed())
		Expect(k8s.Create(ctx, &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: noisyA, Name: "via"}, Spec: viaActivatorWorkflow()})).To(Succeed())
		for _, w := range []struct{ ns, name string }{{noisyB, "wordcount"}, {noisyA, "hold"}, {noisyA, "via"}} {
			waitWorkflowReadyIn(w.ns, w.name)
		}
		// Warm B's pods: the first session of each phase must not pay a
		// cold start.
		for i := 0; i < 3; i++ {
			_, err := wordCount(noisyB, text)
			Expect(err).NotTo(HaveOccurred())
		}
	})

	It("B's sessions without a flood: the baseline", func() {
		busy, routes := hostCPU(), delegatedRoutes(noisyB)
		baseline = wordCounts(noisyB, text, noisyRuns)
		GinkgoWriter.Printf("the host's CPUs were %.0f%% busy during B's sessions without a flood; B's delegated requests by route: %v\n", busy(), routes())
	})

	It("B's sessions during A's flood: all correct, p99 within 2x of the baseline; A gets clear refusals", func() {
		fctx, stop := context.WithCancel(ctx)
		f := &flood{}
		var wg sync.WaitGroup
		for _, run := range []func(context.Context){f.sessions, f.unauthenticatedGRPC, f.oversizedGRPC, f.forgedRefs, f.forgedRefs} {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				run(fctx)
			}()
		}
		// The flood is on before B's first session.
		Eventually(func() int64 { return f.refusedStarts.Load() + f.unauthenticated.Load() }, "30s").Should(BeNumerically(">", 0))
		profiled := profileOperator("flood")
		busy, routes := hostCPU(), delegatedRoutes(noisyB)
		during := wordCounts(noisyB, text, noisyRuns)
		GinkgoWriter.Printf("the host's CPUs were %.0f%% busy during B's sessions of the flood; B's delegated requests by route: %v\n", busy(), routes())
		profiled()
		stop()
		wg.Wait()

		p99Base, p99Flood := percentile(baseline, 0.99), percentile(during, 0.99)
		GinkgoWriter.Printf("noisy neighbours: B's word count p50 %v / p99 %v without the flood, p50 %v / p99 %v during it (%.2fx)\n",
			percentile(baseline, 0.5), p99Base, percentile(during, 0.5), p99Flood, float64(p99Flood)/float64(p99Base))
		GinkgoWriter.Printf("B's sessions without the flood, sorted: %v\nduring it, sorted: %v\n", sorted(baseline), sorted(during))
		GinkgoWriter.Printf("A's flood: %d sessions started, %d starts refused (%v), %d unauthenticated gRPC bodies refused (%d more calls ended with their connection, which the gateway closed after its auth timeout), %d oversized gRPC bodies refused, %d forged-reference requests answered by the activator (%v)\n",
			f.started.Load(), f.refusedStarts.Load(), f.limitNames(), f.unauthenticated.Load(), f.closedConns.Load(), f.oversized.Load(), f.forgedAnswered.Load(), f.forgedCodes())
		Expect(f.errs()).To(BeEmpty(), "A's flood saw answers it should not")
		Expect(f.refusedStarts.Load()).To(BeNumerically(">", 0))
		Expect(f.limitNames()).To(ContainElement(MatchRegexp("sessionsPerNamespace|requestsPerSecond")))
		Expect(f.unauthenticated.Load()).To(BeNumerically(">", 0))
		Expect(f.oversized.Load()).To(BeNumerically(">", 0))
		Expect(f.forgedAnswered.Load()).To(BeNumerically(">", 0))
		Expect(p99Flood).To(BeNumerically("<=", 2*p99Base), "B's p99 during A's flood within 2x of its p99 without it")
	})

	It("never restarted the operator or the activator", func() {
		for _, p := range operatorPods() {
			Expect(restarts(p)).To(BeZero(), "operator pod %s", p.Name)
		}
		pods, err := cs.CoreV1().Pods(knNS).List(ctx, metav1.ListOptions{LabelSelector: "app=activator"})
		Expect(err).NotTo(HaveOccurred())
		Expect(pods.Items).NotTo(BeEmpty())
		for _, p := range pods.Items {
			Expect(restarts(p)).To(BeZero(), "activator pod %s", p.Name)
		}
		printPanicsRecovered(pods.Items)
	})

	It("uninstalls", func() {
		for _, ns := range []string{noisyA, noisyB} {
			var wfs v1alpha1.WorkflowList
			Expect(k8s.List(ctx, &wfs, client.InNamespace(ns))).To(Succeed())
			for i := range wfs.Items {
				Expect(k8s.Delete(ctx, &wfs.Items[i])).To(Succeed())
			}
		}
		Eventually(func(g Gomega) {
			for _, ns := range []string{noisyA, noisyB} {
				var left v1alpha1.WorkflowList
				g.Expect(k8s.List(ctx, &left, client.InNamespace(ns))).To(Succeed())
				g.Expect(left.Items).To(BeEmpty())
			}
		}, "3m").Should(Succeed())
		out, err := helm("uninstall", release, "-n", releaseNS, "--wait", "--timeout", "10m")
		Expect(err).NotTo(HaveOccurred(), out)
		uninstalled = true
	})
})

// pprofPort is the operator's /debug/pprof port when the spec profiles it.
const pprofPort = 6060

// profileDir is where the spec writes the operator's CPU profiles during
// A's flood ($ZIPTRAIL_E2E_PROFILE_DIR; empty: no profiles, and the
// operator serves none).
func profileDir() string { return os.Getenv("ZIPTRAIL_E2E_PROFILE_DIR") }

// profileOperator starts a 20-second CPU profile of each operator pod
// (when profileDir is set), written as <dir>/operator-<name>-<pod>.pprof;
// the function it returns waits for them.
func profileOperator(name string) func() {
	dir := profileDir()
	if dir == "" {
		return func() {}
	}
	var wg sync.WaitGroup
	for _, p := range operatorPods() {
		wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			url := fmt.Sprintf("http://%s:%d/debug/pprof/profile?seconds=20", p.Status.PodIP, pprofPort)
			resp, err := http.Get(url)
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			Expect(err).NotTo(HaveOccurred())
			Expect(resp.StatusCode).To(Equal(http.StatusOK), string(data))
			out := filepath.Join(dir, fmt.Sprintf("operator-%s-%s.pprof", name, p.Name))
			Expect(os.WriteFile(out, data, 0o644)).To(Succeed())
			GinkgoWriter.Printf("the operator's CPU profile during %s: %s\n", name, out)
		}()
	}
	return wg.Wait
}

// hostCPU starts measuring how busy the host's CPUs are (/proc/stat); the
// function it returns says, in percent of all CPUs, since the start.
func hostCPU() func() float64 {
	read := func() (busy, total float64) {
		data, err := os.ReadFile("/proc/stat")
		if err != nil {
			return 0, 0
		}
		line, _, _ := strings.Cut(string(data), "\n")
		// user nice system idle iowait irq softirq steal (guest time is
		// counted in user's already).
		for i, f := range strings.Fields(line)[1:] {
			if i >= 8 {
				break
			}
			var v float64
			_, _ = fmt.Sscan(f, &v)
			total += v
			if i != 3 && i != 4 { // idle, iowait
				busy += v
			}
		}
		return busy, total
	}
	b0, t0 := read()
	return func() float64 {
		b1, t1 := read()
		if t1 <= t0 {
			return 0
		}
		return 100 * (b1 - b0) / (t1 - t0)
	}
}

// delegatedRoutes starts counting the requests of the delegated firings
// of ns's pods by route (their sidecars' ziptrail_delegated_requests_total,
// from the data plane's metrics port): whether they went straight to the
// targets' pods or through Knative's activator, which A floods. The
// function it returns says how many of each since.
func delegatedRoutes(ns string) func() map[string]float64 {
	read := func() map[string]float64 {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		sum := map[string]float64{}
		for _, p := range pods.Items {
			if p.Status.PodIP == "" {
				continue
			}
			resp, err := http.Get("http://" + p.Status.PodIP + ":9193/metrics")
			if err != nil {
				continue
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, l := range strings.Split(string(data), "\n") {
				var route string
				var n float64
				if _, err := fmt.Sscanf(l, "ziptrail_delegated_requests_total{route=%q} %g", &route, &n); err == nil {
					sum[route] += n
				}
			}
		}
		return sum
	}
	before := read()
	return func() map[string]float64 {
		after := read()
		for r, n := range before {
			after[r] -= n
		}
		return after
	}
}

func restarts(p corev1.Pod) int32 {
	var n int32
	for _, c := range p.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

// holdWorkflow keeps its sessions running for a minute: A's running
// sessions reach their limit at once.
func holdWorkflow() v1alpha1.WorkflowSpec {
	one := int32(1)
	f := pyFunction("hold", "import time", `
def handle(inv):
    time.sleep(60)
    ziptrail.send_object("output", "result", b"held")
    return b""`)
	f.MinScale, f.MaxScale = &one, &one
	return v1alpha1.WorkflowSpec{Entry: "hold", Functions: []v1alpha1.FunctionSpec{f}, Buckets: []v1alpha1.NamedBucket{{Name: "output"}},
		SessionDeadline: &metav1.Duration{Duration: 2 * time.Minute}}
}

// viaActivatorWorkflow is a function whose every request goes through
// Knative's activator (target burst capacity -1): activator-ext reads the
// ziptrail headers of every request to it.
func viaActivatorWorkflow() v1alpha1.WorkflowSpec {
	one := int32(1)
	f := pyFunction("echo", "", `
def handle(inv):
    ziptrail.send_object("output", "result", b"ok")
    return b""`)
	f.MinScale, f.MaxScale = &one, &one
	f.Template = revisionAnnotations(map[string]string{"autoscaling.knative.dev/target-burst-capacity": "-1"})
	return v1alpha1.WorkflowSpec{Entry: "echo", Functions: []v1alpha1.FunctionSpec{f}, Buckets: []v1alpha1.NamedBucket{{Name: "output"}}}
}

var wordRE = regexp.MustCompile(`[a-z]+`)

// wordCount runs one word-count session of ns and checks its count; it
// returns the session's time (its three gateway calls).
func wordCount(ns string, text []byte) (time.Duration, error) {
	r := runSession(ns, "wordcount", string(text))
	return r.took(), checkCount(r, text)
}

func checkCount(r sessionRun, text []byte) error {
	if r.status != http.StatusOK || r.session.State != sessions.Completed {
		return fmt.Errorf("session %s: %d %s %.200s", r.session.ID, r.status, r.session.State, r.result)
	}
	var got struct {
		Total    int `json:"total"`
		Distinct int `json:"distinct"`
	}
	if err := json.Unmarshal([]byte(r.result), &got); err != nil {
		return fmt.Errorf("session %s: result %.200s: %v", r.session.ID, r.result, err)
	}
	words := wordRE.FindAllString(strings.ToLower(string(text)), -1)
	distinct := map[string]bool{}
	for _, w := range words {
		distinct[w] = true
	}
	if got.Total != len(words) || got.Distinct != len(distinct) {
		return fmt.Errorf("session %s counted %d words (%d distinct), want %d (%d)", r.session.ID, got.Total, got.Distinct, len(words), len(distinct))
	}
	return nil
}

// wordCounts runs n word-count sessions of ns one after another; every one
// must complete with the right count. It returns their times: the three
// gateway calls of each (the gateway's Service is looked up once, before:
// a Kubernetes API call, rate-limited by client-go, is not the gateway's
// time). Each call's p50/p99 and the slowest session's events (what it
// waited for) are printed.
func wordCounts(ns string, text []byte, n int) []time.Duration {
	gw := gatewayURL()
	var ds, starts, waits, looks []time.Duration
	var slowest sessionRun
	for i := 0; i < n; i++ {
		r := runSessionAt(gw, ns, "wordcount", string(text))
		Expect(checkCount(r, text)).To(Succeed(), "B's session %d", i)
		ds, starts, waits, looks = append(ds, r.took()), append(starts, r.start), append(waits, r.waited), append(looks, r.looked)
		if r.took() > slowest.took() {
			slowest = r
		}
	}
	for _, c := range []struct {
		name string
		ds   []time.Duration
	}{{"start", starts}, {"result", waits}, {"session", looks}} {
		GinkgoWriter.Printf("  %-7s p50 %v p99 %v\n", c.name, percentile(c.ds, 0.5), percentile(c.ds, 0.99))
	}
	GinkgoWriter.Printf("the slowest of %d sessions (%v: start %v, result %v, session %v), %s:\n%s", n, slowest.took().Round(time.Millisecond),
		slowest.start, slowest.waited, slowest.looked, slowest.session.ID, eventLog(slowest.session))
	return ds
}

func sorted(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	for i := range s {
		s[i] = s[i].Round(time.Millisecond)
	}
	return s
}

// percentile is the nearest-rank percentile of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}
