package helm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/operator/sharding"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// The sharded trigger engine (docs/sharding.md) through the chart: its own
// release (same name and namespace as the other Describe's, installed and
// uninstalled here, so the two never overlap), 3 operator replicas, 6
// buckets, short Leases, and a redis-server on the host for the buckets'
// checkpoints, which the operator's pods reach through a selectorless
// Service. The owner of a workflow with a session in flight is SIGKILLed.

const (
	engineBuckets = 6
	engineLease   = 6 * time.Second
	faninWF       = "fanin"
	// checkpointKey is the operator's --checkpoint-key (default): bucket b
	// checkpoints to <checkpointKey>:<b>.
	checkpointKey = "ziptrail:engine"
)

var _ = Describe("the sharded engine through the chart: 3 replicas, the owner of a session in flight SIGKILLed", Ordered, func() {
	var (
		redisSrv    *servers.Redis
		createdNS   bool
		installed   bool
		before      knativeState
		echoes      []string // workflows in buckets other than fanin's
		gate        string
		workflows   []string
		uninstalled bool
		// the pod whose operator process was SIGKILLed, and its restarts
		// before
		killedPod      string
		restartsBefore int32
	)

	AfterEach(func() {
		if !CurrentSpecReport().Failed() {
			return
		}
		leases, _ := cs.CoordinationV1().Leases(releaseNS).List(ctx, metav1.ListOptions{})
		for _, l := range leases.Items {
			h := ""
			if l.Spec.HolderIdentity != nil {
				h = *l.Spec.HolderIdentity
			}
			GinkgoWriter.Printf("--- lease %s holder %q renewed %v\n", l.Name, h, l.Spec.RenewTime)
		}
		for _, p := range operatorPods() {
			GinkgoWriter.Printf("--- pod %s ip %s phase %s ready %v\n", p.Name, p.Status.PodIP, p.Status.Phase, podReady(p))
			if out, err := kubectlRun("", "-n", releaseNS, "logs", p.Name, "--tail", "80"); err == nil {
				GinkgoWriter.Printf("%s\n", out)
			}
		}
	})

	BeforeAll(func() {
		before = readKnativeState()
		for _, ns := range []string{releaseNS, wfNS} {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			if ns == wfNS && err == nil {
				createdNS = true
			}
			Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
		}
		redisSrv = hostRedis()
		var err error
		gate, err = os.MkdirTemp("", "ziptrail-helm-gate-")
		Expect(err).NotTo(HaveOccurred())
		Expect(os.Chmod(gate, 0o777)).To(Succeed())
		DeferCleanup(os.RemoveAll, gate)
	})

	AfterAll(func() {
		if installed && !uninstalled { // a spec failed before the uninstall: leave the cluster to the other specs
			for _, w := range workflows {
				wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: wfNS, Name: w}}
				_ = k8s.Delete(ctx, wf)
				for end := time.Now().Add(2 * time.Minute); time.Now().Before(end) && !apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(wf), wf)); {
					time.Sleep(time.Second)
				}
			}
			out, err := helm("uninstall", release, "-n", releaseNS, "--wait", "--timeout", "10m")
			GinkgoWriter.Printf("cleanup: helm uninstall: %v %s\n", err, out)
		}
		if createdNS { // the other Describe creates it
			Expect(client.IgnoreNotFound(cs.CoreV1().Namespaces().Delete(ctx, wfNS, metav1.DeleteOptions{}))).To(Succeed())
			Eventually(func() bool {
				_, err := cs.CoreV1().Namespaces().Get(ctx, wfNS, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			}, "5m").Should(BeTrue())
		}
	})

	It("installs with engine.sharded=true, 3 replicas, 6 buckets, short Leases and Redis for the checkpoints", func() {
		installed = true // from here on, AfterAll uninstalls if a spec fails
		out, err := helm("install", release, chart, "-n", releaseNS, "--create-namespace",
			"--set", "engine.sharded=true", "--set", fmt.Sprintf("engine.buckets=%d", engineBuckets), "--set", "operator.replicas=3",
			"--set", "engine.leaseDuration="+engineLease.String(), "--set", "engine.renewDeadline=5s", "--set", "engine.retryPeriod=1s",
			"--set", "tiers.redis.address="+redisAddress,
			"--wait", "--timeout", "10m")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("STATUS: deployed"))
	})

	It("runs 3 Ready replicas, each holding 2 buckets' Leases (holder: its pod IP)", func() {
		Eventually(func(g Gomega) {
			rolledOut(g, releaseNS, release+"-operator")
			spread(g, 3)
		}).Should(Succeed())
		// Sharded, every replica serves the control stream and the gateway.
		Expect(readyEndpoints(release + "-gateway")).To(HaveLen(3))
		Expect(readyEndpoints(release + "-control")).To(HaveLen(3))
	})

	It("writes status.engine {bucket, owner} on workflows spread over the buckets, whose sessions run", func() {
		set, err := sharding.New(cs, sharding.Config{Buckets: engineBuckets, Identity: "e2e", Namespace: releaseNS})
		Expect(err).NotTo(HaveOccurred())
		// Three echo workflows in three buckets other than fanin's: at least
		// two of them are owned by another replica than fanin's (2 each).
		used := map[string]bool{set.BucketOf(wfNS, faninWF): true}
		for i := 0; len(echoes) < 3; i++ {
			name := fmt.Sprintf("echo-%d", i)
			if b := set.BucketOf(wfNS, name); !used[b] {
				used[b] = true
				echoes = append(echoes, name)
			}
		}
		workflows = append([]string{faninWF}, echoes...)
		for _, w := range echoes {
			Expect(k8s.Create(ctx, &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: wfNS, Name: w}, Spec: echoWorkflow()})).To(Succeed())
		}
		Expect(k8s.Create(ctx, &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: wfNS, Name: faninWF}, Spec: faninWorkflow(gate)})).To(Succeed())
		byIP := map[string]corev1.Pod{}
		Eventually(func(g Gomega) { byIP = spread(g, 3) }).Should(Succeed())
		for _, w := range workflows {
			waitWorkflowReady(w)
			Eventually(func(g Gomega) {
				e := engineOf(g, w)
				g.Expect(e.Bucket).To(Equal(set.BucketOf(wfNS, w)))
				g.Expect(byIP).To(HaveKey(e.Owner))
				g.Expect(e.Owner).To(Equal(bucketLeases(g)[e.Bucket]), "status.engine.owner of %s is its bucket's holder", w)
			}).Should(Succeed())
			e := engineOf(Default, w)
			GinkgoWriter.Printf("workflow %s: bucket %s, owner %s (%s)\n", w, e.Bucket, e.Owner, byIP[e.Owner].Name)
		}
		g := gw{base: gatewayURL(), token: sessionToken()}
		for _, w := range echoes {
			retries := 0
			Expect(g.session(w, "hello "+w, "hello "+w, &retries)).To(Succeed())
		}
	})

	It("completes the session in flight on the SIGKILLed replica's bucket, once each, while the other replicas' sessions go on", func() {
		g := gw{base: gatewayURL(), token: sessionToken()}
		victim := engineOf(Default, faninWF)
		var steady string
		for _, w := range echoes {
			if engineOf(Default, w).Owner != victim.Owner {
				steady = w
				break
			}
		}
		Expect(steady).NotTo(BeEmpty())
		steadyEngine := engineOf(Default, steady)
		DeferCleanup(func() { _ = os.WriteFile(filepath.Join(gate, "release"), nil, 0o644) })

		// Short sessions on a workflow of a surviving replica, throughout.
		var (
			mu          sync.Mutex
			completions []time.Time
			failures    []string
			retries     int
			stop        = make(chan struct{})
			done        = make(chan struct{})
		)
		loopStart := time.Now()
		go func() {
			defer GinkgoRecover()
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				in := fmt.Sprintf("steady-%d", i)
				r := 0
				err := g.session(steady, in, in, &r)
				mu.Lock()
				retries += r
				if err != nil {
					failures = append(failures, err.Error())
				} else {
					completions = append(completions, time.Now())
				}
				mu.Unlock()
			}
		}()
		completed := func() int { mu.Lock(); defer mu.Unlock(); return len(completions) }
		Eventually(completed).Should(BeNumerically(">=", 5))

		// The fan-in session: a and b done, c waiting at the gate.
		code, body := gatewayDo(http.MethodPost, fmt.Sprintf("%s/v1/namespaces/%s/workflows/%s/sessions", g.base, wfNS, faninWF), strings.NewReader("in"))
		Expect(code).To(Equal(http.StatusCreated), string(body))
		var s sessions.Session
		Expect(json.Unmarshal(body, &s)).To(Succeed())
		getSession := func() (sessions.Session, int) {
			var got sessions.Session
			code, body, err := g.call(http.MethodGet, fmt.Sprintf("/v1/namespaces/%s/sessions/%s", wfNS, s.ID), "")
			if err == nil && code == http.StatusOK {
				Expect(json.Unmarshal([]byte(body), &got)).To(Succeed())
			}
			return got, code
		}
		Eventually(func(g Gomega) {
			g.Expect(filepath.Join(gate, "c-first")).To(BeAnExistingFile())
			got, _ := getSession()
			g.Expect(got.Objects).To(BeNumerically(">=", 5), "3 fan-out objects and the parts of a and b")
		}).WithTimeout(2 * time.Minute).WithPolling(50 * time.Millisecond).Should(Succeed())
		// ... and the bucket's checkpoint in Redis, which its next owner
		// restores, holds it so: the owner saves it every second, and a
		// session started less than that before its owner dies is lost with
		// it (no last save on SIGKILL).
		Eventually(func(g Gomega) {
			data, err := redisSrv.Client.HGet(ctx, checkpointKey+":"+victim.Bucket, "data").Result()
			g.Expect(err).NotTo(HaveOccurred())
			var st struct {
				Sessions []sessions.Session `json:"sessions"`
			}
			g.Expect(json.Unmarshal([]byte(data), &st)).To(Succeed())
			g.Expect(st.Sessions).To(ContainElement(And(HaveField("ID", s.ID), HaveField("Objects", BeNumerically(">=", 5)))))
		}).WithPolling(50 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("session %s in flight, in the checkpoint of %s %s after its start\n", s.ID, victim.Bucket, time.Since(s.Started).Round(time.Millisecond))

		// SIGKILL the operator process of the pod that owns fanin's bucket.
		var owner corev1.Pod
		for _, p := range operatorPods() {
			if p.Status.PodIP == victim.Owner {
				owner = p
			}
		}
		Expect(owner.Name).NotTo(BeEmpty(), "the pod of %s", victim.Owner)
		Expect(bucketLeases(Default)[victim.Bucket]).To(Equal(victim.Owner))
		killedPod, restartsBefore = owner.Name, owner.Status.ContainerStatuses[0].RestartCount
		killedAt := time.Now()
		Expect(localcluster.KillContainerProcess(ctx, cluster.Kubeconfig, &owner, "operator", "--engine-buckets")).To(Succeed())
		AddReportEntry("killed", fmt.Sprintf("SIGKILLed the operator of pod %s (%s), owner of %s, at %s", owner.Name, owner.Status.PodIP, victim.Bucket, killedAt.Format(time.RFC3339Nano)))

		// Takeover: the gateway answers for the session again (served by
		// the bucket's next owner).
		var takenAt time.Time
		Eventually(func() int { _, code := getSession(); return code }).WithTimeout(2 * time.Minute).WithPolling(50 * time.Millisecond).Should(Equal(http.StatusOK))
		takenAt = time.Now()
		heir := bucketLeases(Default)[victim.Bucket]
		takeover := takenAt.Sub(killedAt)
		AddReportEntry("takeover", fmt.Sprintf("bucket %s served again %s after the SIGKILL, by %s (Leases %s)", victim.Bucket, takeover.Round(time.Millisecond), heir, engineLease))
		GinkgoWriter.Printf("takeover of %s: %s, by %s\n", victim.Bucket, takeover.Round(time.Millisecond), heir)

		// Release the gate: c's first run sends its part (its sidecar's
		// control stream follows the bucket) and the join fires once.
		Expect(os.WriteFile(filepath.Join(gate, "release"), nil, 0o644)).To(Succeed())
		var result string
		Eventually(func(gm Gomega) {
			retries := 0
			code, body, err := g.retrying(&retries, http.MethodGet, fmt.Sprintf("/v1/namespaces/%s/sessions/%s/result?wait=30s", wfNS, s.ID), "")
			gm.Expect(err).NotTo(HaveOccurred())
			gm.Expect(code).To(Equal(http.StatusOK), body)
			result = body
		}).WithTimeout(3 * time.Minute).Should(Succeed())
		Expect(result).To(Equal("in|a + in|b + in|c"))
		var final sessions.Session
		Eventually(func() int { var code int; final, code = getSession(); return code }).Should(Equal(http.StatusOK))
		Expect(final.State).To(Equal(sessions.Completed))

		// The other replicas' sessions: stop the loop and look at the
		// completions around the kill.
		close(stop)
		Eventually(done, "3m").Should(BeClosed())
		mu.Lock()
		defer mu.Unlock()
		Expect(failures).To(BeEmpty(), "sessions of %s", steady)
		sort.Slice(completions, func(i, j int) bool { return completions[i].Before(completions[j]) })
		var longest time.Duration
		var longestAt time.Time
		inWindow := 0
		prev := loopStart
		for _, t := range completions {
			if d := t.Sub(prev); d > longest {
				longest, longestAt = d, t
			}
			if t.After(killedAt) && t.Before(takenAt) {
				inWindow++
			}
			prev = t
		}
		report := fmt.Sprintf("%d sessions of %s (owner %s) completed in %s; %d between the SIGKILL and the takeover (%s); longest gap between completions %s (ending %s after the kill); %d gateway calls retried (the dead replica's endpoint)",
			len(completions), steady, steadyEngine.Owner, prev.Sub(loopStart).Round(time.Millisecond), inWindow, takeover.Round(time.Millisecond),
			longest.Round(time.Millisecond), longestAt.Sub(killedAt).Round(time.Millisecond), retries)
		AddReportEntry("other replicas' sessions", report)
		GinkgoWriter.Printf("%s\n", report)
		Expect(inWindow).To(BeNumerically(">=", 1), "sessions of the surviving replica's workflow completed while the victim's bucket was unserved")
		Expect(longest).To(BeNumerically("<", takeover+30*time.Second), "a generous bound")
		// The steady workflow's bucket never moved.
		Expect(engineOf(Default, steady)).To(Equal(steadyEngine))

		// Exactly once: the join ran once, every child Trigger fired once.
		Expect(runsOf(gate, "join")).To(Equal(1))
		Expect(runsOf(gate, "a")).To(Equal(1))
		Expect(runsOf(gate, "b")).To(Equal(1))
		cRuns := runsOf(gate, "c")
		Expect(cRuns).To(BeNumerically("<=", 2))
		for _, t := range []string{"to-a", "to-b", "to-c", "join"} {
			Eventually(func(g Gomega) {
				tr := &v1alpha1.Trigger{}
				g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: wfNS, Name: faninWF + "-" + t}, tr)).To(Succeed())
				g.Expect(tr.Status.Firings).To(Equal(int64(1)), "Trigger %s firings", tr.Name)
			}).Should(Succeed())
		}
		AddReportEntry("fan-in", fmt.Sprintf("session %s: %q, %d invocations, c ran %d time(s), join once, each Trigger fired once", s.ID, result, final.Invocations, cRuns))
		GinkgoWriter.Printf("session %s: %d invocations, c ran %d time(s)\n%s", s.ID, final.Invocations, cRuns, eventLog(final))
		// status.engine names the bucket's holder.
		Eventually(func(g Gomega) {
			e := engineOf(g, faninWF)
			g.Expect(e.Owner).To(Equal(bucketLeases(g)[victim.Bucket]))
		}).Should(Succeed())
	})

	It("comes back to 3 replicas holding 2 buckets each (the killed one restarted by the node agent)", func() {
		// The node agent saw the process die and restarted it after its
		// back-off, in the same pod (same IP, same identity).
		Eventually(func(g Gomega) {
			p, err := cs.CoreV1().Pods(releaseNS).Get(ctx, killedPod, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Status.ContainerStatuses[0].RestartCount).To(BeNumerically(">", restartsBefore))
		}).Should(Succeed())
		Eventually(func(g Gomega) { spread(g, 3) }, "3m").Should(Succeed())
		g := gw{base: gatewayURL(), token: sessionToken()}
		for _, w := range echoes {
			retries := 0
			Expect(g.session(w, "again "+w, "again "+w, &retries)).To(Succeed())
		}
	})

	It("uninstalls with `helm uninstall`: no operator pod, no engine Lease, Knative as it was", func() {
		for _, w := range workflows {
			deleteWorkflow(w)
		}
		out, err := helm("uninstall", release, "-n", releaseNS, "--wait", "--timeout", "10m")
		Expect(err).NotTo(HaveOccurred(), out)
		uninstalled = true
		Eventually(func(g Gomega) {
			g.Expect(operatorPods()).To(BeEmpty())
			g.Expect(engineLeaseNames()).To(BeEmpty(), "Leases of the operator and its engine")
			g.Expect(labelled()).To(BeEmpty())
		}).Should(Succeed())
		Eventually(func(g Gomega) { g.Expect(readKnativeState()).To(Equal(before)) }, "4m").Should(Succeed())
	})
})
