package helm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

const (
	release   = "zt"
	releaseNS = "ziptrail-system"
	wfNS      = "zt-helm-wf" // the workflows' namespace (NetworkPolicy, Workflow)
	knNS      = "knative-serving"
	leaseName = "operator.ziptrail.dev"
	leaderKey = "ziptrail.dev/leader"
	// The chart's images: registry ghcr.io/ziptrail, tag = appVersion.
	queueProxyImage = "ghcr.io/ziptrail/queue-proxy-zl:0.1.0"
	activatorImage  = "ghcr.io/ziptrail/activator-ext:0.1.0"
	savedAnnotation = "ziptrail.dev/saved-before-ziptrail"
)

var operatorSelector = "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/component=operator"

// before is Knative's configuration before the install, which the
// uninstall must restore.
type knativeState struct {
	queueImage, audiences, podinfo string
	hasAudiences, hasPodinfo       bool
	activatorImage                 string
}

func readKnativeState() knativeState {
	var s knativeState
	dep, err := cs.CoreV1().ConfigMaps(knNS).Get(ctx, "config-deployment", metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	s.queueImage = dep.Data["queue-sidecar-image"]
	s.audiences, s.hasAudiences = dep.Data["queue-sidecar-token-audiences"]
	feat, err := cs.CoreV1().ConfigMaps(knNS).Get(ctx, "config-features", metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	s.podinfo, s.hasPodinfo = feat.Data["queueproxy.mount-podinfo"]
	act, err := cs.AppsV1().Deployments(knNS).Get(ctx, "activator", metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	s.activatorImage = act.Spec.Template.Spec.Containers[0].Image
	return s
}

// ref names one object the chart created.
type ref struct {
	gvk             schema.GroupVersionKind
	namespace, name string
}

func (r ref) String() string { return fmt.Sprintf("%s %s/%s", r.gvk.Kind, r.namespace, r.name) }

// releaseObjects parses what `helm get manifest` and `helm get hooks` print:
// every object of the release, hooks included.
func releaseObjects() []ref {
	var refs []ref
	for _, what := range []string{"manifest", "hooks"} {
		out, err := helm("get", what, release, "-n", releaseNS)
		Expect(err).NotTo(HaveOccurred(), out)
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); err == io.EOF {
				break
			} else {
				Expect(err).NotTo(HaveOccurred())
			}
			if u.Object == nil {
				continue
			}
			ns := u.GetNamespace()
			if ns == "" && namespaced(u.GroupVersionKind()) {
				ns = releaseNS
			}
			refs = append(refs, ref{u.GroupVersionKind(), ns, u.GetName()})
		}
	}
	return refs
}

func namespaced(gvk schema.GroupVersionKind) bool {
	m, err := k8s.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	Expect(err).NotTo(HaveOccurred())
	return m.Scope.Name() == meta.RESTScopeNameNamespace
}

func exists(r ref) (bool, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(r.gvk)
	err := k8s.Get(ctx, client.ObjectKey{Namespace: r.namespace, Name: r.name}, u)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// labelled lists every object, of every namespaced and cluster-scoped
// resource the API serves, that carries the release's instance label.
func labelled() []string {
	lists, err := cs.Discovery().ServerPreferredResources()
	if err != nil && len(lists) == 0 {
		Expect(err).NotTo(HaveOccurred())
	}
	var found []string
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		Expect(err).NotTo(HaveOccurred())
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !hasVerb(r.Verbs, "list") {
				continue
			}
			items, err := dyn.Resource(gv.WithResource(r.Name)).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
			if err != nil {
				continue // e.g. an aggregated API that is not there
			}
			for _, it := range items.Items {
				found = append(found, fmt.Sprintf("%s %s/%s", r.Kind, it.GetNamespace(), it.GetName()))
			}
		}
	}
	return found
}

func hasVerb(verbs []string, v string) bool {
	for _, x := range verbs {
		if x == v {
			return true
		}
	}
	return false
}

func operatorPods() []corev1.Pod {
	pods, err := cs.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: operatorSelector})
	Expect(err).NotTo(HaveOccurred())
	return pods.Items
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// rolledOut: the Deployment's current template runs on all its replicas,
// each Ready, and no pod of an older template is left.
func rolledOut(g Gomega, ns, name string) *appsv1.Deployment {
	d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	want := *d.Spec.Replicas
	g.Expect(d.Status.ObservedGeneration).To(Equal(d.Generation), "deployment %s/%s observed", ns, name)
	g.Expect(d.Status.UpdatedReplicas).To(Equal(want), "deployment %s/%s updated replicas", ns, name)
	g.Expect(d.Status.ReadyReplicas).To(Equal(want), "deployment %s/%s ready replicas", ns, name)
	g.Expect(d.Status.AvailableReplicas).To(Equal(want), "deployment %s/%s available replicas", ns, name)
	g.Expect(d.Status.Replicas).To(Equal(want), "deployment %s/%s: pods of an older template left", ns, name)
	return d
}

// leader checks the operator's leader election: exactly one pod carries
// the leader label, it holds the Lease, and the control and gateway
// Services lead to it alone; it returns the leader and the standbys.
func leader(g Gomega) (corev1.Pod, []corev1.Pod) {
	lease, err := cs.CoordinationV1().Leases(releaseNS).Get(ctx, leaseName, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lease.Spec.HolderIdentity).NotTo(BeNil())
	holder, _, _ := strings.Cut(*lease.Spec.HolderIdentity, "_") // <pod name>_<uuid>
	var lead []corev1.Pod
	var standby []corev1.Pod
	for _, p := range operatorPods() {
		if p.DeletionTimestamp != nil {
			continue
		}
		if p.Labels[leaderKey] == "true" {
			lead = append(lead, p)
		} else {
			standby = append(standby, p)
		}
	}
	g.Expect(lead).To(HaveLen(1), "pods labelled %s=true", leaderKey)
	g.Expect(lead[0].Name).To(Equal(holder), "the labelled pod holds the Lease")
	for _, svc := range []string{release + "-control", release + "-gateway"} {
		g.Expect(readyEndpoints(svc)).To(ConsistOf(lead[0].Status.PodIP), "ready endpoints of Service %s", svc)
	}
	return lead[0], standby
}

func readyEndpoints(svc string) []string {
	slices, err := cs.DiscoveryV1().EndpointSlices(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	Expect(err).NotTo(HaveOccurred())
	var ips []string
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				ips = append(ips, e.Addresses...)
			}
		}
	}
	return ips
}

func logs(ns, pod string) string {
	out, err := kubectlRun("", "-n", ns, "logs", pod)
	Expect(err).NotTo(HaveOccurred(), out)
	return out
}

// canI asks the API server whether the operator's ServiceAccount may.
func canI(args ...string) bool {
	// The answer is the last line (kubectl may warn first, e.g. that a
	// resource is not namespaced).
	out, _ := kubectlRun("", append([]string{"auth", "can-i", "--as", "system:serviceaccount:" + releaseNS + ":" + release + "-operator"}, args...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return strings.TrimSpace(lines[len(lines)-1]) == "yes"
}

var _ = Describe("helm install charts/ziptrail on the local cluster", Ordered, func() {
	var (
		before  knativeState
		created = map[string]ref{}
		record  = func() {
			for _, r := range releaseObjects() {
				created[r.String()] = r
			}
		}
	)

	// A failed spec leaves what explains it: the operator's pods, their
	// restarts and the end of their logs.
	AfterEach(func() {
		if !CurrentSpecReport().Failed() {
			return
		}
		for _, p := range operatorPods() {
			GinkgoWriter.Printf("--- pod %s phase %s labels %v ready %v\n", p.Name, p.Status.Phase, p.Labels, podReady(p))
			for _, c := range p.Status.ContainerStatuses {
				GinkgoWriter.Printf("    container %s restarts %d state %+v\n", c.Name, c.RestartCount, c.State)
			}
			if out, err := kubectlRun("", "-n", releaseNS, "logs", p.Name, "--tail", "60"); err == nil {
				GinkgoWriter.Printf("%s\n", out)
			}
		}
	})

	BeforeAll(func() {
		before = readKnativeState()
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: wfNS}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
	})

	It("installs with `helm install` (the post-install hook completes)", func() {
		// --wait: the operator's Deployment rolls out (every pod Ready);
		// helm waits for the hook Job to complete and fails otherwise.
		out, err := helm("install", release, chart, "-n", releaseNS, "--create-namespace",
			"--set", "networkPolicy.enabled=true", "--set", "networkPolicy.namespaces={"+wfNS+"}",
			"--wait", "--timeout", "10m")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("STATUS: deployed"))
		record()
		Expect(created).To(HaveKey("Deployment " + releaseNS + "/" + release + "-operator"))
		Expect(created).To(HaveKey("Job " + releaseNS + "/" + release + "-knative-config"))
		// hook-succeeded: the completed hook Job and its RBAC are deleted.
		for _, name := range []string{"Job " + releaseNS + "/" + release + "-knative-config", "ServiceAccount " + releaseNS + "/" + release + "-hooks"} {
			Eventually(func() (bool, error) { return exists(created[name]) }).Should(BeFalse(), name)
		}
	})

	It("runs the operator as a Deployment of 2 Ready replicas with one elected leader", func() {
		Eventually(func(g Gomega) {
			rolledOut(g, releaseNS, release+"-operator")
			pods := operatorPods()
			g.Expect(pods).To(HaveLen(2))
			for _, p := range pods {
				g.Expect(podReady(p)).To(BeTrue(), "pod %s Ready", p.Name)
			}
			leader(g)
		}).Should(Succeed())
		var lead corev1.Pod
		var standby []corev1.Pod
		Eventually(func(g Gomega) { lead, standby = leader(g) }).Should(Succeed())
		Expect(standby).To(HaveLen(1))
		// Logs through the node agent's kubelet API.
		Eventually(func() string { return logs(releaseNS, lead.Name) }).Should(ContainSubstring("Successfully acquired lease"))
		Expect(logs(releaseNS, standby[0].Name)).To(And(ContainSubstring("Attempting to acquire leader lease"), Not(ContainSubstring("Successfully acquired lease"))))
		// Every replica serves metrics.
		Eventually(func() []string { return readyEndpoints(release + "-metrics") }).Should(HaveLen(2))
	})

	It("creates the operator's Services and RBAC", func() {
		ports := map[string][]int32{release + "-control": {9443}, release + "-gateway": {8088, 8089}, release + "-metrics": {8080}}
		for name, want := range ports {
			svc, err := cs.CoreV1().Services(releaseNS).Get(ctx, name, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			var got []int32
			for _, p := range svc.Spec.Ports {
				got = append(got, p.Port)
			}
			Expect(got).To(ConsistOf(want), "ports of Service %s", name)
		}
		_, err := cs.CoreV1().ServiceAccounts(releaseNS).Get(ctx, release+"-operator", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		for _, name := range []string{release + "-operator", release + "-gateway-auth", "ziptrail-session-runner"} {
			_, err := cs.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred(), "ClusterRole %s", name)
		}
		// What the operator does, asked of the API server's authorizer.
		for _, q := range [][]string{
			{"create", "services.serving.knative.dev", "-n", wfNS},
			{"watch", "workflows.ziptrail.dev", "--all-namespaces"},
			{"update", "workflows.ziptrail.dev/status", "-n", wfNS},
			{"create", "secrets", "-n", wfNS},
			{"create", "tokenreviews.authentication.k8s.io"},
			{"create", "subjectaccessreviews.authorization.k8s.io"},
			{"update", "leases.coordination.k8s.io", "-n", releaseNS},
			{"create", "events", "-n", releaseNS},
			{"patch", "pods", "-n", releaseNS},
		} {
			Expect(canI(q...)).To(BeTrue(), "can-i %v", q)
		}
		// Labelling pods only in its own namespace.
		Expect(canI("patch", "pods", "-n", wfNS)).To(BeFalse())
		Expect(canI("patch", "configmaps", "-n", knNS)).To(BeFalse())
		for _, crd := range []string{"workflows.ziptrail.dev", "buckets.ziptrail.dev", "triggers.ziptrail.dev"} {
			out, err := kubectlRun("", "get", "crd", crd)
			Expect(err).NotTo(HaveOccurred(), out)
		}
	})

	It("configured Knative through the post-install hook (queue-proxy-zl, podinfo, token audience)", func() {
		dep, err := cs.CoreV1().ConfigMaps(knNS).Get(ctx, "config-deployment", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(dep.Data["queue-sidecar-image"]).To(Equal(queueProxyImage))
		Expect(strings.Split(dep.Data["queue-sidecar-token-audiences"], ",")).To(ContainElement("control.ziptrail.dev"))
		Expect(dep.Annotations).To(HaveKey(savedAnnotation), "the values before the install are kept for the uninstall")
		feat, err := cs.CoreV1().ConfigMaps(knNS).Get(ctx, "config-features", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(feat.Data).To(HaveKeyWithValue("queueproxy.mount-podinfo", "enabled"))
		// activatorExt is off by default: Knative's own activator.
		act, err := cs.AppsV1().Deployments(knNS).Get(ctx, "activator", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(act.Spec.Template.Spec.Containers[0].Image).To(Equal(before.activatorImage))
	})

	// The node agent does not enforce NetworkPolicy (docs/local-cluster.md,
	// "Left out"): this spec checks the objects the chart renders, not that
	// traffic is blocked.
	It("renders the data-plane NetworkPolicy in the workflows' namespaces (not enforced by the node agent)", func() {
		np, err := cs.NetworkingV1().NetworkPolicies(wfNS).Get(ctx, release+"-dataplane", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(np.Spec.PolicyTypes).To(ConsistOf(networkingv1.PolicyTypeIngress))
		Expect(np.Spec.PodSelector.MatchExpressions).To(ContainElement(HaveField("Key", "ziptrail.dev/workflow")))
		var ports []int32
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				ports = append(ports, p.Port.IntVal)
			}
		}
		Expect(ports).To(ContainElements(int32(9192), int32(8012), int32(9193)))
	})

	It("makes a Workflow applied after the install Ready through Knative, with queue-proxy-zl as its pods' queue-proxy", func() {
		out, err := kubectlRun("", "-n", wfNS, "apply", "-f", filepath.Join(paths.RepoRoot(), "examples", "wordcount", "workflow.yaml"))
		Expect(err).NotTo(HaveOccurred(), out)
		waitWorkflowReady("wordcount")
		for _, fn := range []string{"split", "map", "reduce", "collect"} {
			svc := "wordcount-" + fn
			out, err := kubectlRun("", "-n", wfNS, "get", "ksvc", svc, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(out).To(Equal("True"), "Knative Service %s Ready", svc)
			pods, err := cs.CoreV1().Pods(wfNS).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service=" + svc})
			Expect(err).NotTo(HaveOccurred())
			Expect(pods.Items).NotTo(BeEmpty())
			p := pods.Items[0]
			var qp *corev1.Container
			for i := range p.Spec.Containers {
				if p.Spec.Containers[i].Name == "queue-proxy" {
					qp = &p.Spec.Containers[i]
				}
			}
			Expect(qp).NotTo(BeNil())
			Expect(qp.Image).To(Equal(queueProxyImage), "pod %s", p.Name)
			var mounts []string
			for _, m := range qp.VolumeMounts {
				mounts = append(mounts, m.MountPath)
			}
			// mount-podinfo and the projected token for the control stream;
			// the objects volume from the chart's pod webhook (podWebhook).
			Expect(mounts).To(ContainElements("/etc/podinfo", "/var/run/secrets/tokens", v1alpha1.ObjectsDir), "pod %s", p.Name)
		}
		// The operator's RBAC was enough for everything it did.
		lead, _ := leader(Default)
		var forbidden []string
		for _, l := range strings.Split(logs(releaseNS, lead.Name), "\n") {
			if strings.Contains(l, "forbidden") {
				forbidden = append(forbidden, l)
			}
		}
		Expect(forbidden).To(BeEmpty(), "the leader's log")
	})

	It("runs a word count session through the chart's session gateway, with a correct count", func() {
		text, err := os.ReadFile(filepath.Join(paths.RepoRoot(), "LICENSE"))
		Expect(err).NotTo(HaveOccurred())
		r := runSession(wfNS, "wordcount", string(text))
		Expect(r.status).To(Equal(http.StatusOK), "result %s; session %+v", r.result, r.session)
		Expect(r.session.State).To(Equal(sessions.Completed))
		var got struct {
			Total    int `json:"total"`
			Distinct int `json:"distinct"`
		}
		Expect(json.Unmarshal([]byte(r.result), &got)).To(Succeed(), r.result)
		words := regexp.MustCompile(`[a-z]+`).FindAllString(strings.ToLower(string(text)), -1)
		distinct := map[string]bool{}
		for _, w := range words {
			distinct[w] = true
		}
		Expect(got.Total).To(Equal(len(words)))
		Expect(got.Distinct).To(Equal(len(distinct)))
	})

	It("without activator-ext, an object whose TTL is shorter than the consumer's cold start expires while its invocation waits in Knative's activator", func() {
		applyWorkflow("keep", keepAliveWorkflow())
		waitScaledToZero("keep-consume")
		t := time.Now()
		r := runSession(wfNS, "keep", "go")
		GinkgoWriter.Printf("without activator-ext: session %s %s after %s, %d invocations:\n%s", r.session.ID, r.session.State,
			time.Since(t).Round(time.Millisecond), r.session.Invocations, eventLog(r.session))
		// The consumer's sidecar could not pull the expired object, and no
		// re-execution rule of this workflow covers the consumer: the
		// session fails, saying why.
		Expect(r.session.State).To(Equal(sessions.Failed))
		Expect(eventLog(r.session)).To(ContainSubstring("resolve inputs: data/blob: reference expired"))
	})

	It("upgrades with `helm upgrade`: activatorExt swaps Knative's activator image, the operator rolls out", func() {
		oldLeader, _ := leader(Default)
		out, err := helm("upgrade", release, chart, "-n", releaseNS, "--reuse-values",
			"--set", "activatorExt.enabled=true", "--set", "operator.logLevel=debug", "--wait", "--timeout", "10m")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(And(ContainSubstring("STATUS: deployed"), ContainSubstring("REVISION: 2")))
		record()

		// Knative's activator runs activator-ext and becomes Ready again.
		Eventually(func(g Gomega) {
			d := rolledOut(g, knNS, "activator")
			c := d.Spec.Template.Spec.Containers[0]
			g.Expect(c.Image).To(Equal(activatorImage))
			g.Expect(c.Env).To(ContainElements(
				corev1.EnvVar{Name: "ZIPTRAIL_KEEPALIVE_INTERVAL", Value: "5s"},
				corev1.EnvVar{Name: "ZIPTRAIL_OPERATOR_ADDR", Value: release + "-control." + releaseNS + ".svc:9443"}))
			pods, err := cs.CoreV1().Pods(knNS).List(ctx, metav1.ListOptions{LabelSelector: "app=activator"})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(pods.Items).NotTo(BeEmpty())
			for _, p := range pods.Items {
				g.Expect(p.Spec.Containers[0].Image).To(Equal(activatorImage), "pod %s", p.Name)
				g.Expect(podReady(p)).To(BeTrue(), "pod %s Ready", p.Name)
			}
		}, "6m").Should(Succeed()) // the first activator-ext pod builds the image
		Eventually(func() string {
			pods, _ := cs.CoreV1().Pods(knNS).List(ctx, metav1.ListOptions{LabelSelector: "app=activator"})
			if len(pods.Items) == 0 {
				return ""
			}
			return logs(knNS, pods.Items[0].Name)
		}).Should(ContainSubstring("Starting activator-ext"))

		// The operator rolled out with the new value: two Ready pods of the
		// new template, one leader.
		Eventually(func(g Gomega) {
			d := rolledOut(g, releaseNS, release+"-operator")
			g.Expect(d.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--zap-log-level=debug"))
			pods := operatorPods()
			g.Expect(pods).To(HaveLen(2))
			for _, p := range pods {
				g.Expect(p.UID).NotTo(Equal(oldLeader.UID))
				g.Expect(podReady(p)).To(BeTrue(), "pod %s Ready", p.Name)
			}
			leader(g)
		}).Should(Succeed())
		waitWorkflowReady("wordcount")
		out, err = helm("history", release, "-n", releaseNS)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("Upgrade complete"))
	})

	It("with activator-ext, keeps the same object alive through the consumer's cold start", func() {
		waitScaledToZero("keep-consume")
		t := time.Now()
		r := runSession(wfNS, "keep", "go")
		GinkgoWriter.Printf("with activator-ext: session %s %s after %s, %d invocations (object TTL %s, consumer start %s)\n", r.session.ID, r.session.State,
			time.Since(t).Round(time.Millisecond), r.session.Invocations, keepAliveTTL, consumerStart)
		Expect(r.status).To(Equal(http.StatusOK), "result %s; session %+v", r.result, r.session)
		Expect(r.session.State).To(Equal(sessions.Completed))
		Expect(r.result).To(Equal("blob:1048576"))
		GinkgoWriter.Printf("%s", eventLog(r.session))
		Expect(eventLog(r.session)).NotTo(ContainSubstring("expired"))
		Expect(r.session.Invocations).To(Equal(2), "produce and consume, nothing re-executed")
		deleteWorkflow("keep")
	})

	It("with activator-ext, sends a consumer's invocation to a ready pod on its producer's node (share over 100 invocations)", func() {
		applyWorkflow("near", localityWorkflow())
		// Two consumer pods on two nodes, one producer pod.
		var producerNode string
		nodeOf := map[string]string{}
		Eventually(func(g Gomega) {
			where := readyPods("near-where")
			g.Expect(where).To(HaveLen(2))
			g.Expect(where[0].Spec.NodeName).NotTo(Equal(where[1].Spec.NodeName), "the consumer's pods are on two nodes")
			for _, p := range where {
				nodeOf[p.Name] = p.Spec.NodeName
			}
			prod := readyPods("near-produce")
			g.Expect(prod).To(HaveLen(1))
			producerNode = prod[0].Spec.NodeName
		}, "3m").Should(Succeed())

		const n, parallel = 100, 4
		var mu sync.Mutex
		same, other := 0, 0
		var wg sync.WaitGroup
		work := make(chan int)
		for w := 0; w < parallel; w++ {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for range work {
					r := runSession(wfNS, "near", "go")
					Expect(r.status).To(Equal(http.StatusOK), "result %s; session %+v", r.result, r.session)
					node, ok := nodeOf[r.result]
					Expect(ok).To(BeTrue(), "the consumer pod %q is one of %v", r.result, nodeOf)
					mu.Lock()
					if node == producerNode {
						same++
					} else {
						other++
					}
					mu.Unlock()
				}
			}()
		}
		for i := 0; i < n; i++ {
			work <- i
		}
		close(work)
		wg.Wait()
		printLocalityEvidence()
		share := float64(same) / float64(n)
		GinkgoWriter.Printf("locality: %d of %d invocations ran on the producer's node %s (%.0f%%); Knative alone spreads them over both nodes\n", same, n, producerNode, 100*share)
		Expect(same + other).To(Equal(n))
		Expect(share).To(BeNumerically(">=", 0.9))
		deleteWorkflow("near")
	})

	It("uninstalls with `helm uninstall`, leaving nothing behind and Knative as it was", func() {
		// A user deletes the workflows first (their finalizer is the
		// operator's).
		wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: wfNS, Name: "wordcount"}}
		Expect(k8s.Delete(ctx, wf)).To(Succeed())
		Eventually(func() bool { return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(wf), wf)) }).Should(BeTrue())

		Expect(created).To(HaveKey("Job " + releaseNS + "/" + release + "-uninstall"))
		out, err := helm("uninstall", release, "-n", releaseNS, "--wait", "--timeout", "10m")
		Expect(err).NotTo(HaveOccurred(), out)

		// Every object of the release (manifest and hooks of both
		// revisions), then anything at all with the release's label.
		var names []string
		for n := range created {
			names = append(names, n)
		}
		GinkgoWriter.Printf("objects of the release: %d\n  %s\n", len(names), strings.Join(names, "\n  "))
		Expect(len(names)).To(BeNumerically(">=", 20))
		Eventually(func(g Gomega) {
			for _, r := range created {
				ok, err := exists(r)
				g.Expect(err).NotTo(HaveOccurred(), r.String())
				g.Expect(ok).To(BeFalse(), "%s is left", r)
			}
			g.Expect(labelled()).To(BeEmpty())
			// The operator's own objects: its pods and its Lease.
			g.Expect(operatorPods()).To(BeEmpty())
			_, err := cs.CoordinationV1().Leases(releaseNS).Get(ctx, leaseName, metav1.GetOptions{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the leader Lease is left")
		}).Should(Succeed())

		// Knative as before the install.
		Eventually(func(g Gomega) {
			after := readKnativeState()
			g.Expect(after).To(Equal(before))
			for _, name := range []string{"config-deployment", "config-features"} {
				cm, err := cs.CoreV1().ConfigMaps(knNS).Get(ctx, name, metav1.GetOptions{})
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(cm.Annotations).NotTo(HaveKey(savedAnnotation))
			}
			d := rolledOut(g, knNS, "activator")
			g.Expect(d.Annotations).NotTo(HaveKey(savedAnnotation))
			g.Expect(d.Spec.Template.Spec.Volumes).NotTo(ContainElement(HaveField("Name", "ziptrail-control-token")))
		}, "4m").Should(Succeed())

		// Helm never deletes the CRDs of a chart's crds/ directory (that
		// would delete every user's Workflows): they stay, by design.
		for _, crd := range []string{"workflows.ziptrail.dev", "buckets.ziptrail.dev", "triggers.ziptrail.dev"} {
			out, err := kubectlRun("", "get", "crd", crd)
			Expect(err).NotTo(HaveOccurred(), out)
		}
	})
})

func waitWorkflowReady(name string) { waitWorkflowReadyIn(wfNS, name) }

func waitWorkflowReadyIn(ns, name string) {
	Eventually(func(g Gomega) {
		wf := &v1alpha1.Workflow{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, wf)).To(Succeed())
		c := meta.FindStatusCondition(wf.Status.Conditions, "Ready")
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
	}, "6m").Should(Succeed())
}
