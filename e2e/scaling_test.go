package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// These specs leave scaling to Knative (the KPA autoscaler, the activator,
// revisions): nothing here deletes a pod. The suite's cluster default is
// min-scale 2; each function here sets its own bounds and autoscaling
// annotations on its revision template.

// scaled sets a function's scale bounds, container concurrency (0 leaves
// Knative's default) and revision annotations (autoscaling.knative.dev/...).
func scaled(f v1alpha1.FunctionSpec, minScale, maxScale int32, cc int64, annotations map[string]string) v1alpha1.FunctionSpec {
	f.MinScale, f.MaxScale = &minScale, &maxScale
	if cc > 0 {
		f.ContainerConcurrency = &cc
	}
	if len(annotations) > 0 {
		raw, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
		Expect(err).NotTo(HaveOccurred())
		f.Template = &runtime.RawExtension{Raw: raw}
	}
	return f
}

// podCounts counts a Knative Service's pods: all of them (terminating ones
// included: a terminating pod may still be backing up its objects) and the
// ready ones that are not being deleted.
func podCounts(ns, svc string) (all, ready int, err error) {
	var list corev1.PodList
	if err := k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{"serving.knative.dev/service": svc}); err != nil {
		return 0, 0, err
	}
	for _, p := range list.Items {
		all++
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready++
			}
		}
	}
	return all, ready, nil
}

// podWatch polls a Service's pod counts in the background until stopped:
// the largest counts it saw and when it first saw at least `at` ready pods.
type podWatch struct {
	mu       sync.Mutex
	maxReady int
	maxAll   int
	reached  time.Time // first time ready >= at
	at       int
	stop     chan struct{}
	done     chan struct{}
}

func watchPods(ns, svc string, at int) *podWatch {
	w := &podWatch{at: at, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(w.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if all, ready, err := podCounts(ns, svc); err == nil {
				w.mu.Lock()
				w.maxAll = max(w.maxAll, all)
				if ready > w.maxReady {
					w.maxReady = ready
				}
				if ready >= w.at && w.reached.IsZero() {
					w.reached = time.Now()
				}
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	DeferCleanup(w.Stop)
	return w
}

func (w *podWatch) Stop() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *podWatch) Max() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxReady
}

// MaxAll is the most pods (ready or not, terminating included) it saw.
func (w *podWatch) MaxAll() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxAll
}

func (w *podWatch) Reached() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reached
}

// tryStartSession starts a session and returns its id or an error (for
// goroutines, where Expect cannot fail the spec by itself).
func tryStartSession(ns, wf, input string) (string, error) {
	resp, err := gw.Post(fmt.Sprintf("%s/v1/namespaces/%s/workflows/%s/sessions", gatewayURL(), ns, wf), "application/octet-stream", strings.NewReader(input))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("start %s: status %d: %s", input, resp.StatusCode, body)
	}
	var s sessions.Session
	if err := json.Unmarshal(body, &s); err != nil {
		return "", err
	}
	return s.ID, nil
}

// tryResult waits (up to 10 minutes, in long polls) for a session's result.
func tryResult(ns, id string) (string, error) {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		resp, err := gw.Get(fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result?wait=1m", gatewayURL(), ns, id))
		if err != nil {
			return "", err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK:
			return string(body), nil
		case resp.StatusCode == http.StatusAccepted && time.Now().Before(deadline):
			continue
		default:
			return "", fmt.Errorf("session %s: status %d: %.500s", id, resp.StatusCode, body)
		}
	}
}

// streamed is one session of a stream.
type streamed struct {
	input, id, result string
	err               error
	started           time.Time
}

// sessionStream starts sessions of a workflow one every interval, each
// waited for in its own goroutine, as long as more() says so (it sees how
// many were started), at most limit.
type sessionStream struct {
	mu   sync.Mutex
	runs []*streamed
	wg   sync.WaitGroup
}

func (st *sessionStream) run(ns, wf string, interval time.Duration, limit int, more func(started int) bool) {
	for i := 0; i < limit && more(i); i++ {
		r := &streamed{input: fmt.Sprintf("s-%03d", i), started: time.Now()}
		st.mu.Lock()
		st.runs = append(st.runs, r)
		st.mu.Unlock()
		st.wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer st.wg.Done()
			id, err := tryStartSession(ns, wf, r.input)
			st.mu.Lock()
			r.id, r.err = id, err
			st.mu.Unlock()
			if err != nil {
				return
			}
			result, err := tryResult(ns, id)
			st.mu.Lock()
			r.result, r.err = result, err
			st.mu.Unlock()
		}()
		time.Sleep(interval)
	}
}

// wait waits for every session's result, then checks each one's result
// and final state; it returns the runs.
func (st *sessionStream) wait(ns string, check func(r *streamed) error) []*streamed {
	st.wg.Wait()
	failed := 0
	var why []string
	for _, r := range st.runs {
		err := r.err
		if err == nil {
			err = check(r)
		}
		if err == nil {
			if s := getSession(Default, ns, r.id); s.State != sessions.Completed {
				err = fmt.Errorf("session %s ended %s: %s", r.id, s.State, s.Error)
			}
		}
		if err != nil {
			failed++
			why = append(why, fmt.Sprintf("%s: %v", r.input, err))
		}
	}
	Expect(failed).To(BeZero(), "%d of %d sessions failed:\n%s", failed, len(st.runs), strings.Join(why, "\n"))
	return st.runs
}

// reversedInput checks a session whose function returns its input reversed.
func reversedInput(r *streamed) error {
	want := []byte(r.input)
	for i, j := 0, len(want)-1; i < j; i, j = i+1, j-1 {
		want[i], want[j] = want[j], want[i]
	}
	if r.result != string(want) {
		return fmt.Errorf("result %q, want %q", r.result, want)
	}
	return nil
}

// pyBlobOf builds an object of n bytes from a seed (blobOf is the same in
// Go): above the inline threshold, so it travels by reference.
const pyBlobOf = `
def blob_of(seed, n):
    unit = seed.encode() + bytes(range(256))
    return (unit * (n // len(unit) + 1))[:n]
`

func blobOf(seed string, n int) []byte {
	unit := []byte(seed)
	for i := 0; i < 256; i++ {
		unit = append(unit, byte(i))
	}
	return []byte(strings.Repeat(string(unit), n/len(unit)+1))[:n]
}

// digestOf is pyDigest's description of blob_of(seed, n) sent as key, read
// from shared memory (so through a resolved reference).
func digestOf(key, seed string, n int) string {
	return fmt.Sprintf("%s:%d:%x:True", key, n, sha256.Sum256(blobOf(seed, n)))
}

// stamp reads a time a function wrote into the gate directory
// (time.time() in seconds).
func stamp(gate, name string) time.Time {
	b, err := os.ReadFile(filepath.Join(gate, name))
	Expect(err).NotTo(HaveOccurred())
	f, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	Expect(err).NotTo(HaveOccurred())
	return time.Unix(0, int64(f*1e9))
}

// pyStamp writes time.time() into a file of the gate directory.
const pyStamp = `
import os, time
def stamp(gate, name):
    tmp = os.path.join(gate, "." + name)
    with open(tmp, "w") as f:
        f.write(repr(time.time()))
    os.rename(tmp, os.path.join(gate, name))
`

var _ = Describe("scaling with Knative (KPA autoscaler, activator, revisions)", func() {
	It("autoscaling: a function under a stream of sessions is scaled up by Knative's KPA while sessions keep completing", func() {
		// One request per pod at a time: Knative's KPA targets 70 % of it,
		// so two sessions a second that each work 1 s need 3 pods.
		ns := deploy("autoscale", v1alpha1.WorkflowSpec{Entry: "work", Functions: []v1alpha1.FunctionSpec{
			scaled(pyFunction("work", `
import time
def handle(inv):
    time.sleep(1)
    return inv.objects[0].bytes()[::-1]`), 1, 4, 1, nil),
		}})
		Eventually(func(g Gomega) {
			_, ready, err := podCounts(ns, "autoscale-work")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ready).To(Equal(1), "min-scale 1: one pod before the load")
		}).WithTimeout(3 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())

		w := watchPods(ns, "autoscale-work", 2)
		start := time.Now()
		st := &sessionStream{}
		// At least 30 sessions over 15 s, and on until Knative has scaled up
		// (at most 6 minutes of load).
		st.run(ns, "autoscale", 500*time.Millisecond, 720, func(n int) bool { return n < 30 || w.Reached().IsZero() })
		runs := st.wait(ns, reversedInput)
		w.Stop()
		Expect(w.Max()).To(BeNumerically(">=", 2), "Knative scaled the function up from 1 pod")
		fmt.Fprintf(GinkgoWriter, "autoscaling: %d sessions, 0 failed; ready pods 1 -> %d; load start -> 2nd ready pod: %v\n",
			len(runs), w.Max(), w.Reached().Sub(start).Round(time.Millisecond))
	})

	It("scale-down: when Knative scales pods down, the unread objects they hold are backed up or spilled and consumers still get them — 0 lost", func() {
		if cluster == nil {
			Skip("reads the local cluster's S3 tier")
		}
		Expect(cluster.S3Endpoint).NotTo(BeEmpty(), "the local cluster has no S3 tier: install MinIO with hack/install-deps.sh")
		const n, size = 12, 1 << 20 // 1 MiB: by reference
		gate := gateDir()
		DeferCleanup(func() { _ = os.WriteFile(filepath.Join(gate, "release"), nil, 0o644) })
		ns := newNamespace()
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "scaledown", Namespace: ns},
			Spec: withBuckets(v1alpha1.WorkflowSpec{Entry: "produce",
				Functions: []v1alpha1.FunctionSpec{
					// One invocation per pod, a 6 s stable window and no floor:
					// Knative scales the producers up under the burst and
					// down to zero once it is over.
					scaled(pyFunction("produce", pyBlobOf+fmt.Sprintf(`
import time
def handle(inv):
    seed = inv.objects[0].bytes().decode()
    time.sleep(1)
    ziptrail.send_object("big", "blob", blob_of(seed, %d))
    ziptrail.send_object("gate-in", "go", "go")
    return b""`, size)), 0, 4, 1, map[string]string{"autoscaling.knative.dev/window": "6s"}),
					// Holds every consumer back until the producers' pods are gone.
					gateFunction(gate, 1200), consumeFunction(),
				},
				Triggers: gatedTriggers(),
			}),
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)

		w := watchPods(ns, "scaledown-produce", 2)
		st := &sessionStream{}
		st.run(ns, "scaledown", 250*time.Millisecond, n, func(int) bool { return true })
		// Every producer has run: each session holds its blob and the gate's go.
		Eventually(func(g Gomega) {
			st.mu.Lock()
			defer st.mu.Unlock()
			for _, r := range st.runs {
				g.Expect(r.id).NotTo(BeEmpty(), "session %s started", r.input)
				g.Expect(getSession(g, ns, r.id).Objects).To(BeNumerically(">=", 2), "session %s: blob and go are ready", r.input)
			}
		}).WithTimeout(5 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
		produced := time.Now()
		peak := w.Max()
		Expect(peak).To(BeNumerically(">=", 1))

		// Knative scales the producer to zero; its pods are gone, terminating
		// ones included (they back up on SIGTERM, during Knative's drain).
		Eventually(func(g Gomega) {
			all, _, err := podCounts(ns, "scaledown-produce")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(all).To(BeZero(), "the producer's pods are gone")
		}).WithTimeout(10 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
		gone := time.Now()
		w.Stop()

		// Every unread blob is in the slow tier, under the namespace's prefix.
		mc, err := minio.New(cluster.S3Endpoint, &minio.Options{Creds: credentials.NewStaticV4(cluster.S3AccessKey, cluster.S3SecretKey, "")})
		Expect(err).NotTo(HaveOccurred())
		backedUp := 0
		for o := range mc.ListObjects(ctx, cluster.S3Bucket, minio.ListObjectsOptions{Prefix: ns + "/", Recursive: true}) {
			Expect(o.Err).NotTo(HaveOccurred())
			if o.Size == size {
				backedUp++
			}
		}
		Expect(backedUp).To(Equal(n), "each session's unread blob was backed up when its pod was scaled down")

		Expect(os.WriteFile(filepath.Join(gate, "release"), nil, 0o644)).To(Succeed())
		st.wait(ns, func(r *streamed) error {
			if want := digestOf("blob", r.input, size); r.result != want {
				return fmt.Errorf("result %q, want %q", r.result, want)
			}
			return nil
		})
		fmt.Fprintf(GinkgoWriter, "scale-down: %d sessions, producer peak %d ready pods, scaled to zero (all pods gone) %v after the last object, %d/%d unread objects backed up, 0 lost\n",
			n, peak, gone.Sub(produced).Round(time.Millisecond), backedUp, n)
	})

	It("scale to zero between sessions: the next session's invocation carries a reference to an object held by another function's pod and succeeds", func() {
		const size = 1 << 20 // by reference
		gate := gateDir()
		ns := deploy("zero", v1alpha1.WorkflowSpec{Entry: "hold",
			Functions: []v1alpha1.FunctionSpec{
				scaled(pyFunction("hold", pyStamp+pyBlobOf+fmt.Sprintf(`
def handle(inv):
    seed = inv.objects[0].bytes().decode()
    ziptrail.send_object("big", "blob", blob_of(seed, %d), metadata={"seed": seed})
    stamp(%q, "sent-" + seed)
    return b""`, size, gate)), 1, 1, 0, nil),
				scaled(pyFunction("read", pyStamp+pyDigest+fmt.Sprintf(`
def handle(inv):
    o = inv.objects[0]
    stamp(%q, "started-" + o.metadata["seed"])
    ziptrail.send_object("output", "result", digest(o))
    return b""`, gate)), 0, 1, 0, map[string]string{"autoscaling.knative.dev/window": "6s"}),
			},
			Triggers: []v1alpha1.NamedTrigger{trig("read-blob", "big", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"read"}})},
		})

		first, s := runSession(ns, "zero", "first")
		Expect(s.State).To(Equal(sessions.Completed))
		Expect(first).To(Equal(digestOf("blob", "first", size)))

		// Knative scales the idle reader to zero; the holder stays.
		Eventually(func(g Gomega) {
			all, _, err := podCounts(ns, "zero-read")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(all).To(BeZero(), "the reader scaled to zero")
		}).WithTimeout(10 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
		_, holders, err := podCounts(ns, "zero-hold")
		Expect(err).NotTo(HaveOccurred())
		Expect(holders).To(Equal(1), "min-scale 1 keeps the holder's pod")

		// The next session: the reader cold-starts through the activator
		// and pulls the holder pod's object by reference.
		w := watchPods(ns, "zero-read", 1)
		t0 := time.Now()
		second, s := runSession(ns, "zero", "second")
		total := time.Since(t0)
		Expect(s.State).To(Equal(sessions.Completed))
		Expect(second).To(Equal(digestOf("blob", "second", size)))
		w.Stop()
		Expect(w.MaxAll()).To(BeNumerically(">=", 1), "the reader came back from zero: Knative started a pod for it")
		cold := stamp(gate, "started-second").Sub(stamp(gate, "sent-second"))
		fmt.Fprintf(GinkgoWriter, "scale to zero: cold start of the reader (object sent by the holder -> reader's handler started): %v; whole session %v\n",
			cold.Round(time.Millisecond), total.Round(time.Millisecond))
	})

	It("rollout: changing a function's image args (or env) rolls out a new revision; sessions in flight complete", func() {
		const size = 200 << 10 // by reference
		first := scaled(pyFunction("first", fmt.Sprintf(`
import os, time
def handle(inv):
    seed = inv.objects[0].bytes().decode()
    time.sleep(0.5)
    head = ("%%s:%%s|" %% (os.environ["VERSION"], seed)).encode()
    ziptrail.send_object("mid", "x", head + b"." * (%d - len(head)))
    return b""`, size)), 1, 2, 0, map[string]string{"autoscaling.knative.dev/window": "6s"})
		first.Env = []corev1.EnvVar{{Name: "VERSION", Value: "v1"}}
		ns := deploy("roll", v1alpha1.WorkflowSpec{Entry: "first",
			Functions: []v1alpha1.FunctionSpec{first,
				pyFunction("second", fmt.Sprintf(`
import time
def handle(inv):
    o = inv.objects[0]
    assert o.size == %d and o._map is not None, (o.size, o._map)
    time.sleep(0.5)
    ziptrail.send_object("output", "result", o.bytes().split(b"|")[0])
    return b""`, size)),
			},
			Triggers: []v1alpha1.NamedTrigger{trig("to-second", "mid", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"second"}})},
		})
		revision := func(g Gomega) string {
			ks := &servingv1.Service{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "roll-first"}, ks)).To(Succeed())
			return ks.Status.LatestReadyRevisionName
		}
		old := revision(Default)
		Expect(old).NotTo(BeEmpty())

		// Sessions every 300 ms: before the update, during the rollout and
		// after it, until one ran on the new revision.
		var (
			mu                 sync.Mutex
			updated, rolledOut time.Time
			newRev             string
		)
		st := &sessionStream{}
		sawV2 := func() bool {
			st.mu.Lock()
			defer st.mu.Unlock()
			for _, r := range st.runs {
				if strings.HasPrefix(r.result, "v2:") {
					return true
				}
			}
			return false
		}
		go func() {
			defer GinkgoRecover()
			time.Sleep(5 * time.Second) // sessions on v1 in flight first
			Eventually(func(g Gomega) {
				wf := &v1alpha1.Workflow{}
				g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "roll"}, wf)).To(Succeed())
				wf.Spec.Functions[0].Env = []corev1.EnvVar{{Name: "VERSION", Value: "v2"}}
				g.Expect(k8s.Update(ctx, wf)).To(Succeed())
			}).WithTimeout(time.Minute).Should(Succeed())
			mu.Lock()
			updated = time.Now()
			mu.Unlock()
			var rev string
			Eventually(func(g Gomega) {
				rev = revision(g)
				g.Expect(rev).NotTo(Equal(old), "a new revision became ready")
			}).WithTimeout(5 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
			mu.Lock()
			rolledOut, newRev = time.Now(), rev
			mu.Unlock()
		}()
		st.run(ns, "roll", 300*time.Millisecond, 600, func(n int) bool {
			mu.Lock()
			done := !rolledOut.IsZero()
			mu.Unlock()
			// 20 more sessions after the new revision is ready, then on
			// until one returned from it.
			return !done || n < 40 || !sawV2()
		})
		results := map[string]int{}
		runs := st.wait(ns, func(r *streamed) error {
			v, in, _ := strings.Cut(r.result, ":")
			if in != r.input || (v != "v1" && v != "v2") {
				return fmt.Errorf("result %q, want v1:%s or v2:%s", r.result, r.input, r.input)
			}
			results[v]++
			return nil
		})
		mu.Lock()
		defer mu.Unlock()
		Expect(rolledOut.IsZero()).To(BeFalse())
		Expect(results["v1"]).To(BeNumerically(">=", 1), "sessions ran on the old revision")
		Expect(results["v2"]).To(BeNumerically(">=", 1), "sessions ran on the new revision")
		fmt.Fprintf(GinkgoWriter, "rollout: %d sessions (v1 %d, v2 %d), 0 failed; revision %s -> %s ready %v after the Workflow update\n",
			len(runs), results["v1"], results["v2"], old, newRev, rolledOut.Sub(updated).Round(time.Millisecond))
	})
})
