package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
)

// echoImage is the node agent's test image (e2e/images/echo in the catalog).
const echoImage = "ziptrail.dev/e2e/echo:latest"

// newNamespace creates a namespace for one spec, deleted after it.
func newNamespace() string {
	ns := "node-" + rand.String(6)
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	Expect(k8s.WaitDefaultServiceAccount(ctx, cs, ns)).To(Succeed())
	return ns
}

// echo is a container of the echo image with its pod's name and IP.
func echo(env ...corev1.EnvVar) corev1.Container {
	return corev1.Container{
		Name: "echo", Image: echoImage,
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		Env: append([]corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		}, env...),
	}
}

func readinessProbe() *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 1, FailureThreshold: 1,
	}
}

func deployment(ns, name string, replicas int32, c corev1.Container) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers:                    []corev1.Container{c},
					TerminationGracePeriodSeconds: ptr.To(int64(2)),
					// One pod per node before any node gets a second one.
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
				},
			},
		},
	}
}

// readyPods returns the Ready, not terminating pods with label app=name.
func readyPods(ns, name string) []corev1.Pod {
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	Expect(err).NotTo(HaveOccurred())
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && podReady(&p) {
			out = append(out, p)
		}
	}
	return out
}

func allPods(ns, name string) []corev1.Pod {
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	Expect(err).NotTo(HaveOccurred())
	return list.Items
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// clusterResolver resolves through the cluster DNS Service, as
// `dig @<kube-dns ClusterIP>` does on the host.
func clusterResolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(cluster.State.DNSIP, "53"))
	}}
}

// hostGet GETs url from the host, resolving cluster names through the cluster DNS.
func hostGet(url string) (string, error) {
	tr := &http.Transport{DialContext: (&net.Dialer{Resolver: clusterResolver(), Timeout: 3 * time.Second}).DialContext, DisableKeepAlives: true}
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return string(body), err
}

func runKubectl(args ...string) (string, error) {
	cmd := exec.Command(kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.Kubeconfig)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func podLogs(ns, pod string) string {
	data, err := cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return "logs: " + err.Error()
	}
	return string(data)
}

var _ = Describe("Deployments and Services", func() {
	It("runs 3 replicas Ready over both nodes, reaches them through a ClusterIP Service by DNS name from the host and from a pod, and scales up and down", func() {
		ns := newNamespace()
		c := echo()
		c.ReadinessProbe = readinessProbe()
		_, err := cs.AppsV1().Deployments(ns).Create(ctx, deployment(ns, "echo", 3, c), metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() []corev1.Pod { return readyPods(ns, "echo") }).Should(HaveLen(3))
		nodes := map[string]int{}
		for _, p := range readyPods(ns, "echo") {
			nodes[p.Spec.NodeName]++
			Expect(p.Status.PodIP).NotTo(BeEmpty())
		}
		Expect(nodes).To(HaveLen(2), "pods per node: %v", nodes)

		_, err = cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": "echo"},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
			},
		}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		name := "echo." + ns + ".svc.cluster.local"

		By("from the host, by DNS name, every pod answers")
		seen := map[string]bool{}
		Eventually(func(g Gomega) {
			body, err := hostGet("http://" + name + "/")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(body).To(HavePrefix("echo from echo-"))
			seen[strings.Fields(body)[2]] = true
			g.Expect(seen).To(HaveLen(3))
		}).Should(Succeed())

		By("from another pod, by its short name")
		client := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "client", Namespace: ns},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "client", Image: echoImage,
					Command: []string{"wget", "-q", "-T", "5", "-t", "3", "-O", "-", "http://echo/from-pod"},
				}},
			},
		}
		_, err = cs.CoreV1().Pods(ns).Create(ctx, client, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() corev1.PodPhase {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, "client", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			return p.Status.Phase
		}).Should(Or(Equal(corev1.PodSucceeded), Equal(corev1.PodFailed)))
		Expect(podLogs(ns, "client")).To(MatchRegexp(`echo from echo-\S+ \(\S+\) /from-pod`))

		By("scaling up to 5 and down to 1")
		scale := func(n int32) {
			// The deployment controller writes the Deployment too (its
			// status): a scale read before that write conflicts with it, and
			// is read and written again, as kubectl scale does.
			Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
				s, err := cs.AppsV1().Deployments(ns).GetScale(ctx, "echo", metav1.GetOptions{})
				if err != nil {
					return err
				}
				s.Spec.Replicas = n
				_, err = cs.AppsV1().Deployments(ns).UpdateScale(ctx, "echo", s, metav1.UpdateOptions{})
				return err
			})).To(Succeed())
		}
		scale(5)
		Eventually(func() []corev1.Pod { return readyPods(ns, "echo") }).Should(HaveLen(5))
		scale(1)
		Eventually(func() []corev1.Pod { return allPods(ns, "echo") }).Should(HaveLen(1))
		Eventually(func() []corev1.Pod { return readyPods(ns, "echo") }).Should(HaveLen(1))
		Eventually(func(g Gomega) {
			body, err := hostGet("http://" + name + "/")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(body).To(ContainSubstring(readyPods(ns, "echo")[0].Name))
		}).Should(Succeed())
	})

	It("lets a pod reach the API server through the kubernetes Service, verified with the mounted CA and authenticated by its token", func() {
		ns := newNamespace()
		sa := "/var/run/secrets/kubernetes.io/serviceaccount"
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "in-cluster", Namespace: ns},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "client", Image: echoImage,
					// What rest.InClusterConfig does: the Service's env, the
					// token and the CA of the ServiceAccount admission's volume.
					Command: []string{"sh", "-c", `wget -q -O - --ca-certificate=` + sa + `/ca.crt ` +
						`--header="Authorization: Bearer $(cat ` + sa + `/token)" ` +
						`https://kubernetes.default.svc/api && echo && ` +
						`wget -q -O - --ca-certificate=` + sa + `/ca.crt https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/readyz`},
				}},
			},
		}
		_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() corev1.PodPhase {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, "in-cluster", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			return p.Status.Phase
		}).Should(Or(Equal(corev1.PodSucceeded), Equal(corev1.PodFailed)))
		logs := podLogs(ns, "in-cluster")
		Expect(logs).To(And(MatchRegexp(`"kind":\s*"APIVersions"`), HaveSuffix("ok")), logs)
	})

	It("lets a pod reach itself through its own Service (hairpin)", func() {
		ns := newNamespace()
		server := echo()
		server.ReadinessProbe = readinessProbe()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "hair", Namespace: ns, Labels: map[string]string{"app": "hair"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{server, {
				Name: "client", Image: echoImage,
				Command: []string{"sh", "-c", "until wget -q -T 2 -O - http://mirror/self; do sleep 1; done; exec sleep 3600"},
			}}, TerminationGracePeriodSeconds: ptr.To(int64(1))},
		}
		_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		_, err = cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			// Not the pod's own name, which its /etc/hosts maps to its IP.
			ObjectMeta: metav1.ObjectMeta{Name: "mirror", Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "hair"},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() string {
			data, err := cs.CoreV1().Pods(ns).GetLogs("hair", &corev1.PodLogOptions{Container: "client"}).DoRaw(ctx)
			if err != nil {
				return err.Error()
			}
			return string(data)
		}).Should(MatchRegexp(`echo from hair \(\S+\) /self`))
	})

	It("takes a pod whose readiness probe fails out of the Service's EndpointSlice, and back when it passes", func() {
		ns := newNamespace()
		c := echo()
		c.ReadinessProbe = readinessProbe()
		_, err := cs.AppsV1().Deployments(ns).Create(ctx, deployment(ns, "web", 2, c), metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		_, err = cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		readyAddrs := func() []string {
			slices, err := cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
			Expect(err).NotTo(HaveOccurred())
			var out []string
			for _, s := range slices.Items {
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						out = append(out, e.Addresses...)
					}
				}
			}
			return out
		}
		Eventually(readyAddrs).Should(HaveLen(2))
		victim := readyPods(ns, "web")[0]
		toggle := func(ok bool) {
			resp, err := http.Post(fmt.Sprintf("http://%s:8080/ready?ok=%v", victim.Status.PodIP, ok), "", nil)
			Expect(err).NotTo(HaveOccurred())
			resp.Body.Close()
		}
		toggle(false)
		Eventually(readyAddrs).Should(And(HaveLen(1), Not(ContainElement(victim.Status.PodIP))))
		Eventually(func() bool {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, victim.Name, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			return podReady(p)
		}).Should(BeFalse())
		toggle(true)
		Eventually(readyAddrs).Should(ContainElement(victim.Status.PodIP))
	})
})

var _ = Describe("Pod lifecycle", func() {
	It("restarts a crashing container with back-off and counts the restarts", func() {
		ns := newNamespace()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "crasher", Namespace: ns},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{echo(corev1.EnvVar{Name: "CRASH_AFTER", Value: "200ms"})}},
		}
		_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		var backOff bool
		Eventually(func(g Gomega) {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, "crasher", metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Status.ContainerStatuses).To(HaveLen(1))
			st := p.Status.ContainerStatuses[0]
			if st.State.Waiting != nil && st.State.Waiting.Reason == "CrashLoopBackOff" {
				backOff = true
			}
			g.Expect(st.RestartCount).To(BeNumerically(">=", 2))
			g.Expect(st.LastTerminationState.Terminated).NotTo(BeNil())
			g.Expect(st.LastTerminationState.Terminated.ExitCode).To(Equal(int32(1)))
			g.Expect(backOff).To(BeTrue(), "never saw CrashLoopBackOff")
		}).WithTimeout(2 * time.Minute).Should(Succeed())
		out, err := runKubectl("get", "pod", "crasher", "-n", ns)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(MatchRegexp(`crasher\s+\S+\s+(CrashLoopBackOff|Running|Error)\s+[2-9]`))
	})

	It("runs preStop, then SIGTERM, then SIGKILL after the grace period when a pod is deleted", func() {
		ns := newNamespace()
		c := echo(corev1.EnvVar{Name: "TERM_DELAY", Value: "forever"})
		c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: "/hook?name=prestop", Port: intstr.FromInt32(8080)},
		}}
		c.ReadinessProbe = readinessProbe()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "stubborn", Namespace: ns},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{c}, TerminationGracePeriodSeconds: ptr.To(int64(3))},
		}
		_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() []corev1.Pod {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, "stubborn", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			if podReady(p) {
				return []corev1.Pod{*p}
			}
			return nil
		}).Should(HaveLen(1))
		// Follow the logs through the termination.
		stream, err := cs.CoreV1().Pods(ns).GetLogs("stubborn", &corev1.PodLogOptions{Follow: true}).Stream(ctx)
		Expect(err).NotTo(HaveOccurred())
		defer stream.Close()
		lines := make(chan string, 100)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stream)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		deleted := time.Now()
		Expect(cs.CoreV1().Pods(ns).Delete(ctx, "stubborn", metav1.DeleteOptions{})).To(Succeed())
		var got []string
		for l := range lines {
			got = append(got, l)
		}
		Expect(strings.Join(got, "\n")).To(MatchRegexp(`(?s)hook prestop called.*received terminated.*ignoring terminated`))
		Expect(strings.Join(got, "\n")).NotTo(ContainSubstring("exiting"))
		Eventually(func() bool {
			_, err := cs.CoreV1().Pods(ns).Get(ctx, "stubborn", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}).Should(BeTrue())
		// The container ignored SIGTERM: only SIGKILL at the end of the grace
		// period could stop it.
		Expect(time.Since(deleted)).To(BeNumerically(">=", 3*time.Second))
	})

	It("reports an image that is not in the catalog as ErrImagePull, naming the catalog", func() {
		ns := newNamespace()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "unknown", Namespace: ns},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/nope:1"}}},
		}
		_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func(g Gomega) {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, "unknown", metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Status.ContainerStatuses).To(HaveLen(1))
			w := p.Status.ContainerStatuses[0].State.Waiting
			g.Expect(w).NotTo(BeNil())
			g.Expect(w.Reason).To(Or(Equal("ErrImagePull"), Equal("ImagePullBackOff")))
			g.Expect(w.Message).To(And(ContainSubstring("registry.invalid/nope:1"), ContainSubstring("images.yaml")))
			g.Expect(p.Status.Phase).To(Equal(corev1.PodPending))
		}).Should(Succeed())
	})
})

var _ = Describe("Service-account tokens", func() {
	It("mounts a projected token with an audience that TokenReview accepts for that audience only", func() {
		ns := newNamespace()
		c := echo()
		c.ReadinessProbe = readinessProbe()
		c.VolumeMounts = []corev1.VolumeMount{{Name: "tok", MountPath: "/var/run/secrets/ziptrail"}}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "tokened", Namespace: ns},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{c},
				Volumes: []corev1.Volume{{Name: "tok", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
					Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
						Audience: "ziptrail.dev/e2e", ExpirationSeconds: ptr.To(int64(3600)), Path: "token",
					}}},
				}}}},
			},
		}
		_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		var p *corev1.Pod
		Eventually(func() bool {
			p, err = cs.CoreV1().Pods(ns).Get(ctx, "tokened", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			return podReady(p)
		}).Should(BeTrue())
		token, err := hostGet("http://" + p.Status.PodIP + ":8080/file?path=/var/run/secrets/ziptrail/token")
		Expect(err).NotTo(HaveOccurred())
		review := func(aud string) authnv1.TokenReviewStatus {
			r, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
				Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{aud}},
			}, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
			return r.Status
		}
		ok := review("ziptrail.dev/e2e")
		Expect(ok.Authenticated).To(BeTrue(), "%+v", ok)
		Expect(ok.User.Username).To(Equal("system:serviceaccount:" + ns + ":default"))
		Expect(ok.User.Extra["authentication.kubernetes.io/pod-name"]).To(ConsistOf("tokened"))
		Expect(review("another-audience").Authenticated).To(BeFalse())
		// The API token the ServiceAccount admission plugin adds is there too.
		_, err = hostGet("http://" + p.Status.PodIP + ":8080/file?path=/var/run/secrets/kubernetes.io/serviceaccount/token")
		Expect(err).NotTo(HaveOccurred())
	})
})

var _ = Describe("kubectl", func() {
	It("shows logs, pods with their nodes and IPs, and a pod's description with events", func() {
		ns := newNamespace()
		c := echo(corev1.EnvVar{Name: "LOG_LINES", Value: "first-line,second-line"})
		c.ReadinessProbe = readinessProbe()
		_, err := cs.AppsV1().Deployments(ns).Create(ctx, deployment(ns, "talker", 1, c), metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() []corev1.Pod { return readyPods(ns, "talker") }).Should(HaveLen(1))
		p := readyPods(ns, "talker")[0]

		out, err := runKubectl("logs", "-n", ns, p.Name)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("first-line\nsecond-line"))
		out, err = runKubectl("logs", "-n", ns, "deployment/talker", "--tail=1")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("second-line\n"))

		out, err = runKubectl("get", "pods", "-n", ns, "-o", "wide")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(MatchRegexp(`%s\s+1/1\s+Running\s+0\s+\S+\s+%s\s+%s`, p.Name, strings.ReplaceAll(p.Status.PodIP, ".", `\.`), p.Spec.NodeName))

		out, err = runKubectl("describe", "pod", "-n", ns, p.Name)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(And(
			MatchRegexp(`Node:\s+%s/`, p.Spec.NodeName),
			MatchRegexp(`IP:\s+%s`, strings.ReplaceAll(p.Status.PodIP, ".", `\.`)),
			MatchRegexp(`Image:\s+%s`, regexp.QuoteMeta(echoImage)),
			MatchRegexp(`Ready\s+True`),
			ContainSubstring("Events:"),
			MatchRegexp(`Normal\s+Scheduled`),
		))

		out, err = runKubectl("get", "nodes", "-o", "wide")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(And(MatchRegexp(`node-1\s+Ready`), MatchRegexp(`node-2\s+Ready`)))
	})
})
