package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// pyEcho answers every request with FUNCTION and the request body.
const pyEcho = `
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = (os.environ["ZIPTRAIL_FUNCTION"] + ":").encode() + data
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["PORT"])), H).serve_forever()
`

func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	// Deleting the namespace takes its functions' pods with it: on a real
	// cluster they hold the nodes' CPU requests (queue-proxy asks 25m).
	DeferCleanup(func() { _ = k8s.Delete(context.Background(), ns) })
	return ns.Name
}

// invoke POSTs body to a Knative Service through the ingress.
func invoke(ns, svc, body string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ingress+"/", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	s := &servingv1.Service{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: svc}, s); err != nil {
		return "", err
	}
	if s.Status.URL == nil {
		return "", fmt.Errorf("service %s has no URL yet", svc)
	}
	req.Host = s.Status.URL.Host
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return string(b), err
}

var _ = Describe("a Workflow on the cluster", func() {
	It("deploys every function as a Knative Service that becomes ready and serves through the ingress", func() {
		ns := newNamespace()
		fn := func(name string) v1alpha1.FunctionSpec {
			return v1alpha1.FunctionSpec{Name: name, Image: pythonImage, Command: []string{"python3", "-c", pyEcho}}
		}
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "chain", Namespace: ns},
			Spec: v1alpha1.WorkflowSpec{
				Entry:        "first",
				Functions:    []v1alpha1.FunctionSpec{fn("first"), fn("second")},
				Dependencies: []v1alpha1.Dependency{{From: []string{"first"}, To: []string{"second"}}},
			},
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		Eventually(func(g Gomega) {
			got := &v1alpha1.Workflow{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), got)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady)).To(BeTrue(), "%v", got.Status.Conditions)
		}).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())

		for _, f := range []string{"first", "second"} {
			Expect(invoke(ns, "chain-"+f, "ping")).To(Equal(f + ":ping"))
		}
	})

	It("configures queue-proxy-zl only through Knative's channels: no ziptrail env on queue-proxy, podinfo mounted, no secret in the pod", func() {
		ns := newNamespace()
		ttl := metav1.Duration{Duration: 7 * time.Minute}
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: ns},
			Spec: v1alpha1.WorkflowSpec{
				Entry:     "only",
				Functions: []v1alpha1.FunctionSpec{{Name: "only", Image: pythonImage, Command: []string{"python3", "-c", pyEcho}}},
				Buckets:   []v1alpha1.NamedBucket{{Name: "out", Spec: v1alpha1.BucketSpec{ObjectTTL: &ttl}}},
			},
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		Eventually(func(g Gomega) {
			got := &v1alpha1.Workflow{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), got)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady)).To(BeTrue(), "%v", got.Status.Conditions)
		}).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
		// The sidecar found the operator (its address is only in podinfo):
		// the function serves through it.
		Expect(invoke(ns, "podinfo-only", "ping")).To(Equal("only:ping"))

		var deps appsv1.DeploymentList
		Expect(k8s.List(ctx, &deps, client.InNamespace(ns), client.MatchingLabels{"serving.knative.dev/service": "podinfo-only"})).To(Succeed())
		Expect(deps.Items).NotTo(BeEmpty(), "the Deployment Knative generates for the revision")
		for _, d := range deps.Items {
			pod := d.Spec.Template
			// The per-function settings are revision annotations, which
			// Knative copies onto the pod; no tier secret among them.
			Expect(pod.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationWorkflow, "podinfo"))
			Expect(pod.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationFunction, "only"))
			Expect(pod.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationObjectTTL, "7m0s"))
			Expect(pod.Annotations).To(HaveKey(v1alpha1.AnnotationControlAddr))
			var qp *corev1.Container
			for i := range pod.Spec.Containers {
				c := &pod.Spec.Containers[i]
				if c.Name == "queue-proxy" {
					qp = c
				}
				for _, e := range c.Env {
					if target() == "local" {
						Expect(e.Value).NotTo(ContainSubstring("ziptrail-local-secret"), "container %s env %s carries the S3 secret", c.Name, e.Name)
					}
				}
			}
			Expect(qp).NotTo(BeNil(), "queue-proxy container of %s", d.Name)
			for _, e := range qp.Env {
				Expect(e.Name).NotTo(HavePrefix("ZIPTRAIL_"), "queue-proxy env of %s", d.Name)
			}
			for k, v := range pod.Annotations {
				if target() == "local" {
					Expect(v).NotTo(ContainSubstring("ziptrail-local-secret"), "annotation %s", k)
				}
			}
			mounted := false
			for _, m := range qp.VolumeMounts {
				if m.MountPath == "/etc/podinfo" {
					mounted = true
				}
			}
			Expect(mounted).To(BeTrue(), "queue-proxy of %s mounts the podinfo volume at /etc/podinfo: %v", d.Name, qp.VolumeMounts)
		}
	})
})
