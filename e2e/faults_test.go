package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// startSession starts a session through the gateway without waiting for it.
func startSession(ns, wf, input string) string {
	resp, err := gw.Post(fmt.Sprintf("%s/v1/namespaces/%s/workflows/%s/sessions", gatewayURL(), ns, wf), "application/octet-stream", strings.NewReader(input))
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	Expect(resp.StatusCode).To(Equal(http.StatusCreated), string(body))
	var s sessions.Session
	Expect(json.Unmarshal(body, &s)).To(Succeed())
	return s.ID
}

// getSession reads a session's state through the gateway.
func getSession(g Gomega, ns, id string) sessions.Session {
	resp, err := gw.Get(fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s", gatewayURL(), ns, id))
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	var s sessions.Session
	g.Expect(json.NewDecoder(resp.Body).Decode(&s)).To(Succeed())
	return s
}

// sessionResult waits for a session's result through the gateway.
func sessionResult(ns, id string) string {
	resp, err := gw.Get(fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result?wait=2m", gatewayURL(), ns, id))
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	Expect(resp.StatusCode).To(Equal(http.StatusOK), "result: %s", body)
	return string(body)
}

// gateDir is a directory functions and the spec share (pods share the
// host's file system): functions signal progress by creating files in it and
// wait for files the spec creates.
func gateDir() string {
	dir, err := os.MkdirTemp("", "ziptrail-e2e-gate-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	return dir
}

// pyWaitFor is Python that blocks until a file exists, records a run in a
// directory, and tells the first run from the others.
const pyWaitFor = `
import os, tempfile, time
def wait_for(path, limit=120):
    deadline = time.time() + limit
    while not os.path.exists(path):
        if time.time() > deadline:
            raise RuntimeError("gave up waiting for " + path)
        time.sleep(0.02)
def record_run(gate, name):
    os.close(tempfile.mkstemp(prefix=name + "-run-", dir=gate)[0])
def first_run(gate, name):
    try:
        os.close(os.open(os.path.join(gate, name + "-first"), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False
`

// runs counts the runs record_run recorded.
func runs(gate, name string) int {
	m, err := filepath.Glob(filepath.Join(gate, name+"-run-*"))
	Expect(err).NotTo(HaveOccurred())
	return len(m)
}

func fileExists(path string) bool { _, err := os.Stat(path); return err == nil }

// gateFunction waits (at most limit seconds) until the spec writes
// <gate>/release, then sends "release" to bucket big: with gatedTriggers it
// holds consumeFunction back while the spec (or Knative) removes the
// producer's pods.
func gateFunction(gate string, limit int) v1alpha1.FunctionSpec {
	return pyFunction("gate", pyWaitFor+fmt.Sprintf(`
def handle(inv):
    wait_for(os.path.join(%q, "release"), limit=%d)
    ziptrail.send_object("big", "release", "ok")
    return b""`, gate, limit))
}

// consumeFunction reports the digest of bucket big's "blob" as the result.
func consumeFunction() v1alpha1.FunctionSpec {
	return pyFunction("consume", pyDigest+`
def handle(inv):
    ziptrail.send_object("output", "result", digest(inv.object("big", "blob")))
    return b""`)
}

// gatedTriggers: the producer's "go" in gate-in opens the gate; consume
// runs once big holds both the blob and the gate's release.
func gatedTriggers() []v1alpha1.NamedTrigger {
	return []v1alpha1.NamedTrigger{
		trig("open-gate", "gate-in", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"gate"}}),
		trig("consume", "big", v1alpha1.TriggerSpec{Primitive: v1alpha1.BySet,
			BySet: &v1alpha1.BySetParams{Keys: []string{"blob", "release"}}, Targets: []string{"consume"}}),
	}
}

var _ = Describe("fault tolerance", func() {
	BeforeEach(func() {
		if cluster == nil {
			Skip("injects faults into local pods and the local operator; the kind target has neither")
		}
	})

	It("re-executes a function whose instances are killed mid-invocation", func() {
		gate := gateDir()
		ns := newNamespace()
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "crashy", Namespace: ns},
			Spec: withBuckets(v1alpha1.WorkflowSpec{Entry: "entry",
				Functions: []v1alpha1.FunctionSpec{
					pyFunction("entry", emit(`[("work", "job", {})]`)),
					// The first attempt announces itself and hangs until killed.
					pyFunction("slow", pyWaitFor+fmt.Sprintf(`
def handle(inv):
    record_run(%[1]q, "slow")
    if first_run(%[1]q, "slow"):
        wait_for(os.path.join(%[1]q, "never"))
    ziptrail.send_object("output", "result", "done")
    return b""`, gate)),
				},
				Triggers: []v1alpha1.NamedTrigger{trig("run-slow", "work", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"slow"},
					Reexecution: []v1alpha1.ReexecutionRule{{SourceFunction: "slow", Timeout: metav1.Duration{Duration: 5 * time.Second}, MaxAttempts: 3}}})},
			}),
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)
		id := startSession(ns, "crashy", "go")

		// While "slow" runs, crash every instance of it.
		Eventually(func() bool { return fileExists(filepath.Join(gate, "slow-first")) }).WithTimeout(time.Minute).Should(BeTrue())
		pods, err := cluster.FunctionPods(ctx, ns, "crashy-slow")
		Expect(err).NotTo(HaveOccurred())
		Expect(pods).NotTo(BeEmpty())
		for i := range pods {
			Expect(cluster.KillUserProcess(ctx, &pods[i], "python3")).To(Succeed())
		}
		Expect(sessionResult(ns, id)).To(Equal("done"))
		Expect(runs(gate, "slow")).To(BeNumerically(">=", 2), "the lost invocation was re-executed")
		// The crashed user containers were restarted by the node agent, or
		// their pods replaced.
		Eventually(func(g Gomega) {
			for _, p := range pods {
				got, err := cluster.Clientset.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					continue
				}
				g.Expect(err).NotTo(HaveOccurred())
				restarts := int32(0)
				for _, c := range got.Status.ContainerStatuses {
					if c.Name == "user-container" {
						restarts = c.RestartCount
					}
				}
				g.Expect(restarts).To(BeNumerically(">=", 1), "pod %s", p.Name)
			}
		}).WithTimeout(time.Minute).Should(Succeed())
	})

	It("backs up a terminating producer pod's unread objects to S3, and the consumer still reads them", func() {
		Expect(cluster.S3Endpoint).NotTo(BeEmpty(), "the local cluster has no S3 tier: install MinIO with hack/install-deps.sh")
		gate := gateDir()
		ns := newNamespace()
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "backup", Namespace: ns},
			Spec: withBuckets(v1alpha1.WorkflowSpec{Entry: "produce",
				Functions: []v1alpha1.FunctionSpec{
					pyFunction("produce", pyBlob+`
def handle(inv):
    ziptrail.send_object("big", "blob", blob("blob"))
    ziptrail.send_object("gate-in", "go", "go")
    return b""`),
					// Holds the consumer back until the spec has terminated the producer's pods.
					gateFunction(gate, 120), consumeFunction(),
				},
				Triggers: gatedTriggers(),
			}),
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)
		id := startSession(ns, "backup", "go")
		Eventually(func(g Gomega) {
			g.Expect(getSession(g, ns, id).Objects).To(BeNumerically(">=", 2), "blob and go are ready")
		}).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).Should(Succeed())

		// Scale the producer down: SIGTERM to every pod holding the blob.
		pods, err := cluster.FunctionPods(ctx, ns, "backup-produce")
		Expect(err).NotTo(HaveOccurred())
		Expect(pods).NotTo(BeEmpty())
		var wg sync.WaitGroup
		for i := range pods {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				Expect(cluster.TerminatePod(ctx, &pods[i])).To(Succeed())
			}()
		}
		wg.Wait()
		now, err := cluster.FunctionPods(ctx, ns, "backup-produce")
		Expect(err).NotTo(HaveOccurred())
		for _, p := range now {
			for _, old := range pods {
				Expect(p.Name).NotTo(Equal(old.Name), "terminated pods are gone")
			}
		}

		// The backup is in the slow tier, under the namespace's prefix.
		mc, err := minio.New(cluster.S3Endpoint, &minio.Options{Creds: credentials.NewStaticV4(cluster.S3AccessKey, cluster.S3SecretKey, "")})
		Expect(err).NotTo(HaveOccurred())
		var backedUp []string
		for o := range mc.ListObjects(ctx, cluster.S3Bucket, minio.ListObjectsOptions{Prefix: ns + "/", Recursive: true}) {
			Expect(o.Err).NotTo(HaveOccurred())
			if o.Size == blobSize {
				backedUp = append(backedUp, o.Key)
			}
		}
		Expect(backedUp).To(HaveLen(1), "exactly the unread 10 MiB object is backed up")

		Expect(os.WriteFile(filepath.Join(gate, "release"), nil, 0o644)).To(Succeed())
		Expect(sessionResult(ns, id)).To(Equal(expectedDigest("blob")))
	})

	It("completes a session when the operator restarts in the middle of it", func() {
		Expect(cluster.RedisAddr).NotTo(BeEmpty(), "the local cluster has no Redis for engine checkpoints: install redis-server")
		gate := gateDir()
		DeferCleanup(func() { _ = os.WriteFile(filepath.Join(gate, "release"), nil, 0o644) })
		ns := newNamespace()
		imm := func(bucket, target string) v1alpha1.NamedTrigger {
			return trig(bucket, bucket, v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{target}})
		}
		part := func(name string) v1alpha1.FunctionSpec {
			return pyFunction(name, pyWaitFor+fmt.Sprintf(`
def handle(inv):
    if %[2]q == "c":
        record_run(%[1]q, "c")
        if first_run(%[1]q, "c"):
            wait_for(os.path.join(%[1]q, "release"))  # outlives the operator
    ziptrail.send_object("parts", %[2]q, inv.objects[0].bytes() + b"|" + %[2]q.encode())
    return b""`, gate, name))
		}
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "restart", Namespace: ns},
			Spec: withBuckets(v1alpha1.WorkflowSpec{Entry: "split",
				Functions: []v1alpha1.FunctionSpec{
					pyFunction("split", `
def handle(inv):
    for b in ("to-a", "to-b", "to-c"):
        ziptrail.send_object(b, "x", inv.objects[0].bytes())
    return b""`),
					part("a"), part("b"), part("c"),
					pyFunction("join", `
def handle(inv):
    ziptrail.send_object("output", "result", " + ".join(sorted(o.bytes().decode() for o in inv.objects)))
    return b""`),
				},
				Triggers: []v1alpha1.NamedTrigger{imm("to-a", "a"), imm("to-b", "b"), imm("to-c", "c"),
					trig("join", "parts", v1alpha1.TriggerSpec{Primitive: v1alpha1.BySet,
						BySet: &v1alpha1.BySetParams{Keys: []string{"a", "b", "c"}}, Targets: []string{"join"},
						// c's output must arrive within 3s of c starting, or c runs again.
						Reexecution: []v1alpha1.ReexecutionRule{{SourceFunction: "c", Timeout: metav1.Duration{Duration: 3 * time.Second}, MaxAttempts: 2}}})},
			}),
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)
		id := startSession(ns, "restart", "in")
		// a and b are done (3 fan-out objects + 2 parts), c is running.
		Eventually(func(g Gomega) {
			g.Expect(fileExists(filepath.Join(gate, "c-first"))).To(BeTrue())
			g.Expect(getSession(g, ns, id).Objects).To(BeNumerically(">=", 5))
		}).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).Should(Succeed())

		Expect(cluster.RestartOperator(ctx)).To(Succeed())

		// The new operator knows the session from the checkpoint, re-executes
		// the lost c and fires the fan-in once.
		Expect(sessionResult(ns, id)).To(Equal("in|a + in|b + in|c"))
		Eventually(func(g Gomega) { g.Expect(getSession(g, ns, id).State).To(Equal(sessions.Completed)) }).Should(Succeed())
		Expect(runs(gate, "c")).To(Equal(2), "c ran twice: the run lost with the old operator and its re-execution")
		s := getSession(Default, ns, id)
		Expect(s.Invocations).To(Equal(6), "split, a, b, c twice, join once")
	})

	// Issue 32: an operator whose engine stops (here: its checkpoint
	// fenced by a newer generation, as another owner's would be) comes
	// back, as the kubelet restarts a pod whose process exited; sessions
	// started after it work.
	It("restarts an operator whose engine stopped", func() {
		Expect(cluster.RedisAddr).NotTo(BeEmpty(), "the local cluster has no Redis for engine checkpoints: install redis-server")
		ns := newNamespace()
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
			Spec: withBuckets(v1alpha1.WorkflowSpec{Entry: "echo", Functions: []v1alpha1.FunctionSpec{pyFunction("echo", `
def handle(inv):
    ziptrail.send_object("output", "result", b"echo:" + inv.objects[0].bytes())
    return b""`)}}),
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)
		Expect(sessionResult(ns, startSession(ns, "echo", "one"))).To(Equal("echo:one"))

		before := cluster.OperatorRestarts()
		rc := redis.NewClient(&redis.Options{Addr: cluster.RedisAddr})
		DeferCleanup(rc.Close)
		gen, err := rc.HGet(ctx, "ziptrail:engine", "gen").Int64()
		Expect(err).NotTo(HaveOccurred())
		// Another writer's newer generation: the engine's next save is
		// refused, and it stops.
		Expect(rc.HSet(ctx, "ziptrail:engine", "gen", gen+1000, "writer", "e2e-intruder").Err()).To(Succeed())
		Eventually(cluster.OperatorRestarts).WithTimeout(2*time.Minute).WithPolling(100*time.Millisecond).Should(BeNumerically(">", before),
			"the operator's engine stopped and nobody restarted it")
		var id string
		Eventually(func(g Gomega) {
			resp, err := gw.Post(fmt.Sprintf("%s/v1/namespaces/%s/workflows/echo/sessions", gatewayURL(), ns), "application/octet-stream", strings.NewReader("two"))
			g.Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			g.Expect(resp.StatusCode).To(Equal(http.StatusCreated), string(body))
			var s sessions.Session
			g.Expect(json.Unmarshal(body, &s)).To(Succeed())
			id = s.ID
		}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		Expect(sessionResult(ns, id)).To(Equal("echo:two"))
	})
})
