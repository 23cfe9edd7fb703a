package helm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/chartops"
)

// Sessions through the chart's operator: its session gateway Service,
// reached from the host at its ClusterIP (kube-proxy runs on the host), with
// the token of a ServiceAccount bound to the chart's
// ziptrail-session-runner ClusterRole, as a user's client would.

// pythonImage is the image catalog's generic Python with the SDK.
const pythonImage = "ghcr.io/ziptrail/python:3"

// pyFunction runs a Python handler with the repository's SDK; prelude runs
// before the function serves (e.g. a slow start).
func pyFunction(name, prelude, body string) v1alpha1.FunctionSpec {
	src := "import ziptrail\n" + prelude + "\n" + body + "\nziptrail.serve(handle)\n"
	return v1alpha1.FunctionSpec{Name: name, Image: pythonImage, Command: []string{"python3", "-c", src}}
}

// revisionAnnotations is a function's revision template with annotations
// (Knative's autoscaling settings per revision).
func revisionAnnotations(kv map[string]string) *runtime.RawExtension {
	raw, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": kv}})
	Expect(err).NotTo(HaveOccurred())
	return &runtime.RawExtension{Raw: raw}
}

var (
	runnerOnce  sync.Once
	runnerToken string
)

// sessionToken is a token of ServiceAccount default/e2e-runner, bound to the
// chart's ziptrail-session-runner ClusterRole.
func sessionToken() string {
	runnerOnce.Do(func() {
		var err error
		runnerToken, err = chartops.RunnerToken(ctx, cs, "default", "e2e-runner", time.Hour)
		Expect(err).NotTo(HaveOccurred())
	})
	return runnerToken
}

// gatewayURL is the chart's session gateway Service (HTTP port).
func gatewayURL() string {
	url, _, err := rel.Gateway(ctx)
	Expect(err).NotTo(HaveOccurred())
	return url
}

func gatewayDo(method, url string, body io.Reader) (int, []byte) {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+sessionToken())
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, data
}

// sessionRun is one session's outcome: the result call's status and body,
// the session as the gateway reports it at the end, and how long each of
// the three gateway calls took (start, result, session).
type sessionRun struct {
	status                int
	result                string
	session               sessions.Session
	start, waited, looked time.Duration
}

// took is the session's time as its client saw it: its three gateway calls.
func (r sessionRun) took() time.Duration { return r.start + r.waited + r.looked }

// runSession starts a session of ns/wf through the chart's gateway and
// waits for its result.
func runSession(ns, wf, input string) sessionRun {
	return runSessionAt(gatewayURL(), ns, wf, input)
}

// runSessionAt is runSession through the gateway at gw (its URL looked up
// once by a caller that times sessions: the lookup is a Kubernetes API
// call, rate-limited by client-go, not the gateway's time).
func runSessionAt(gw, ns, wf, input string) sessionRun {
	t := time.Now()
	code, body := gatewayDo(http.MethodPost, fmt.Sprintf("%s/v1/namespaces/%s/workflows/%s/sessions", gw, ns, wf), strings.NewReader(input))
	Expect(code).To(Equal(http.StatusCreated), string(body))
	var s sessions.Session
	Expect(json.Unmarshal(body, &s)).To(Succeed())
	var r sessionRun
	r.start = time.Since(t)
	var res []byte
	t = time.Now()
	r.status, res = gatewayDo(http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result?wait=3m", gw, ns, s.ID), nil)
	r.waited = time.Since(t)
	r.result = string(res)
	t = time.Now()
	code, body = gatewayDo(http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s", gw, ns, s.ID), nil)
	r.looked = time.Since(t)
	Expect(code).To(Equal(http.StatusOK), string(body))
	Expect(json.Unmarshal(body, &r.session)).To(Succeed())
	return r
}

// applyWorkflow creates (or replaces) a Workflow in wfNS and waits until it
// is Ready.
func applyWorkflow(name string, spec v1alpha1.WorkflowSpec) {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: wfNS, Name: name}, Spec: spec}
	Expect(k8s.Create(ctx, wf)).To(Succeed())
	waitWorkflowReady(name)
}

// deleteWorkflow deletes a Workflow of wfNS and waits until it is gone (its
// finalizer is the operator's).
func deleteWorkflow(name string) {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: wfNS, Name: name}}
	Expect(client.IgnoreNotFound(k8s.Delete(ctx, wf))).To(Succeed())
	Eventually(func() bool { return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(wf), wf)) }).Should(BeTrue())
}

// readyPods lists the Ready pods of a function's Knative Service.
func readyPods(svc string) []corev1.Pod {
	list, err := cs.CoreV1().Pods(wfNS).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service=" + svc})
	Expect(err).NotTo(HaveOccurred())
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && podReady(p) {
			pods = append(pods, p)
		}
	}
	return pods
}

// keepAliveTTL is the object TTL of the keep-alive workflow's bucket, and
// consumerStart the consumer's slow start (before it serves), so that its
// cold start through Knative's activator takes longer than the TTL.
const (
	keepAliveTTL  = 2 * time.Second
	consumerStart = 8 * time.Second
)

// keepAliveWorkflow: "produce" (always running) sends a 1 MiB object (by
// reference, it stays in its pod) to bucket "data", whose objects live
// keepAliveTTL; an Immediate trigger invokes "consume", scaled to zero
// (initial scale 0), which starts slowly: its invocation waits in Knative's
// activator longer than the object lives.
func keepAliveWorkflow() v1alpha1.WorkflowSpec {
	consume := pyFunction("consume", fmt.Sprintf("import time\ntime.sleep(%d)", int(consumerStart.Seconds())), `
def handle(inv):
    o = inv.objects[0]
    ziptrail.send_object("output", "result", "%s:%d" % (o.key, len(o.bytes())))
    return b""`)
	consume.Template = revisionAnnotations(map[string]string{"autoscaling.knative.dev/initial-scale": "0"})
	zero := int32(0)
	consume.MinScale = &zero
	produce := pyFunction("produce", "", `
def handle(inv):
    ziptrail.send_object("data", "blob", b"z" * 1048576)
    return b""`)
	one := int32(1)
	produce.MinScale = &one
	return v1alpha1.WorkflowSpec{
		Entry:     "produce",
		Functions: []v1alpha1.FunctionSpec{produce, consume},
		// A pod's store keeps objects for the longest TTL of the workflow's
		// buckets (each defaults to 10m): both are short.
		Buckets: []v1alpha1.NamedBucket{
			{Name: "data", Spec: v1alpha1.BucketSpec{ObjectTTL: &metav1.Duration{Duration: keepAliveTTL}}},
			{Name: "output", Spec: v1alpha1.BucketSpec{ObjectTTL: &metav1.Duration{Duration: keepAliveTTL}}},
		},
		Triggers: []v1alpha1.NamedTrigger{{Name: "consume-data", Spec: v1alpha1.TriggerSpec{
			Bucket: "data", Primitive: v1alpha1.Immediate, Targets: []string{"consume"}}}},
		SessionDeadline: &metav1.Duration{Duration: 90 * time.Second},
	}
}

// waitScaledToZero waits until a function's Knative Service has no pod.
func waitScaledToZero(svc string) {
	Eventually(func(g Gomega) {
		list, err := cs.CoreV1().Pods(wfNS).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service=" + svc})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(list.Items).To(BeEmpty(), "pods of %s", svc)
	}, "3m").Should(Succeed())
}

// localityWorkflow: "produce" (one pod) sends a 1 MiB object per session;
// "where" (two pods, Knative's activator always on its path: target burst
// capacity -1) reports the pod that got it.
func localityWorkflow() v1alpha1.WorkflowSpec {
	produce := pyFunction("produce", "", `
def handle(inv):
    ziptrail.send_object("data", "blob", b"n" * 1048576)
    return b""`)
	one, two := int32(1), int32(2)
	produce.MinScale, produce.MaxScale = &one, &one
	where := pyFunction("where", "import os", `
def handle(inv):
    assert len(inv.objects[0].bytes()) == 1048576
    ziptrail.send_object("output", "result", os.environ["HOSTNAME"])
    return b""`)
	where.MinScale, where.MaxScale = &two, &two
	where.Template = revisionAnnotations(map[string]string{"autoscaling.knative.dev/target-burst-capacity": "-1"})
	return v1alpha1.WorkflowSpec{
		Entry:     "produce",
		Functions: []v1alpha1.FunctionSpec{produce, where},
		Buckets:   []v1alpha1.NamedBucket{{Name: "data"}, {Name: "output"}},
		Triggers: []v1alpha1.NamedTrigger{{Name: "where-data", Spec: v1alpha1.TriggerSpec{
			Bucket: "data", Primitive: v1alpha1.Immediate, Targets: []string{"where"}}}},
	}
}

// eventLog is a session's progress log, one event a line, lower case.
func eventLog(s sessions.Session) string {
	var b strings.Builder
	for _, e := range s.Events {
		fmt.Fprintf(&b, "  %s %s: %s\n", e.Time.Format("15:04:05.000"), e.Kind, e.Message)
	}
	return strings.ToLower(b.String())
}

// printLocalityEvidence prints what activator-ext decided (its locality
// decisions counter, from each activator pod's Prometheus endpoint, which
// config-observability's metrics-protocol enables in this suite) and how
// Knative's throttler routes the revisions (its log).
func printLocalityEvidence() {
	pods, err := cs.CoreV1().Pods(knNS).List(ctx, metav1.ListOptions{LabelSelector: "app=activator"})
	Expect(err).NotTo(HaveOccurred())
	for _, p := range pods.Items {
		GinkgoWriter.Printf("--- activator pod %s (%s)\n", p.Name, p.Spec.NodeName)
		if resp, err := http.Get("http://" + p.Status.PodIP + ":9090/metrics"); err == nil {
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, l := range strings.Split(string(data), "\n") {
				if strings.Contains(l, "ziptrail_activator") && !strings.HasPrefix(l, "#") {
					GinkgoWriter.Printf("  %s\n", l)
				}
			}
		} else {
			GinkgoWriter.Printf("  metrics: %v\n", err)
		}
		if out, err := kubectlRun("", "-n", knNS, "logs", p.Name); err == nil {
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "near-where") && (strings.Contains(l, "Throttler") || strings.Contains(l, "capacity")) {
					GinkgoWriter.Printf("  %s\n", l)
				}
			}
		}
	}
}
