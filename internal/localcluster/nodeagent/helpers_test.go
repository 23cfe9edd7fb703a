package nodeagent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const echoImage = "ziptrail.dev/e2e/echo:latest"

// echoPod is a pod of the echo test image on a node, serving on 8080 with a
// readiness probe on /healthz.
func echoPod(ns, name, node string) *corev1.Pod {
	grace := int64(5)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:  "echo",
				Image: echoImage,
				Env: []corev1.EnvVar{
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
					{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
					{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
				},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http"),
						HTTPHeaders: []corev1.HTTPHeader{{Name: "K-Network-Probe", Value: "queue"}}}},
					PeriodSeconds: 1, FailureThreshold: 1,
				},
			}},
		},
	}
}

func create(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	p, err := client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func getPod(g Gomega, ns, name string) *corev1.Pod {
	p, err := client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return p
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitReady waits for the pod to be Running and Ready and returns it.
func waitReady(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	g := NewWithT(t)
	var pod *corev1.Pod
	// The first start builds the echo image (go build).
	g.Eventually(func(g Gomega) {
		pod = getPod(g, ns, name)
		g.Expect(pod.Status.Phase).To(Equal(corev1.PodRunning), "status: %+v", pod.Status)
		g.Expect(isReady(pod)).To(BeTrue(), "conditions: %+v", pod.Status.Conditions)
	}, 3*time.Minute, 200*time.Millisecond).Should(Succeed())
	return pod
}

// httpGet fetches a URL from the host.
func httpGet(url string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b), err
}

func echoURL(pod *corev1.Pod, path string) string {
	return fmt.Sprintf("http://%s:8080%s", pod.Status.PodIP, path)
}

// readFile reads a file as the pod's container sees it.
func readFile(pod *corev1.Pod, path string) (string, error) {
	return httpGet(echoURL(pod, "/file?path="+path))
}

// events lists the reasons and messages of a pod's events.
func events(g Gomega, pod *corev1.Pod) []string {
	list, err := client.CoreV1().Events(pod.Namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)).String()})
	g.Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out
}

func containsLine(lines []string, sub string) bool {
	for _, l := range lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func writeFile(path, data string) error { return os.WriteFile(path, []byte(data), 0o644) }

func removeFile(path string) error { return os.Remove(path) }

func errorsAs(err error, target any) bool { return errors.As(err, target) }
