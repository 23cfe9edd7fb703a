package nodeagent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// A pod shaped like a Knative revision's: a user container and a
// queue-proxy sharing the network namespace; queue-proxy's readiness probe
// with K-Network-Probe; the user container's preStop to queue-proxy's
// :8022/wait-for-drain; SERVING_POD_IP/HOST_IP fieldRefs; the podinfo
// annotations at /etc/podinfo; the kube-api-access projected volume
// (token, kube-root-ca.crt, namespace) the ServiceAccount admission adds.
func TestKnativeShapedPod(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	_, err := client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"},
		Data: map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\n"}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	expiry := int64(3607)
	grace := int64(10)
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello-00001-deployment-abc", Namespace: ns,
			Annotations: map[string]string{"serving.knative.dev/creator": "admin", "autoscaling.knative.dev/min-scale": "1"}},
		Spec: corev1.PodSpec{
			NodeName: nodes[1].Name, ServiceAccountName: "default", TerminationGracePeriodSeconds: &grace,
			EnableServiceLinks: new(bool),
			Containers: []corev1.Container{
				{
					Name: "user-container", Image: echoImage,
					Env: []corev1.EnvVar{{Name: "PORT", Value: "8080"}, {Name: "K_REVISION", Value: "hello-00001"}},
					Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{
						Path: "/hook?name=wait-for-drain", Port: intstr.FromInt32(8022)}}},
					TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
					VolumeMounts:             []corev1.VolumeMount{{Name: "kube-api-access-x", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
				},
				{
					Name: "queue-proxy", Image: echoImage,
					Env: []corev1.EnvVar{
						{Name: "PORT", Value: "8022"},
						// Like queue-proxy, keep serving for a drain period after SIGTERM:
						// the containers are stopped in parallel, as the kubelet does.
						{Name: "TERM_DELAY", Value: "3s"},
						{Name: "SERVING_POD", ValueFrom: field("metadata.name")},
						{Name: "SERVING_NAMESPACE", ValueFrom: field("metadata.namespace")},
						{Name: "SERVING_POD_IP", ValueFrom: field("status.podIP")},
						{Name: "HOST_IP", ValueFrom: field("status.hostIP")},
					},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
						Path: "/healthz", Port: intstr.FromInt32(8022), HTTPHeaders: []corev1.HTTPHeader{{Name: "K-Network-Probe", Value: "queue"}}}},
						PeriodSeconds: 10},
					VolumeMounts: []corev1.VolumeMount{{Name: "knative-podinfo", MountPath: "/etc/podinfo", ReadOnly: true}},
				},
			},
			Volumes: []corev1.Volume{
				{Name: "knative-podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
					{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}}}}}},
				{Name: "kube-api-access-x", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{ExpirationSeconds: &expiry, Path: "token"}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
						Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
						{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
				}}}},
			},
		},
	}
	create(t, pod)
	p := waitReady(t, ns, pod.Name)
	g.Expect(p.Status.ContainerStatuses).To(HaveLen(2))
	qp := func(path string) string {
		out, err := httpGet("http://" + p.Status.PodIP + ":8022" + path)
		g.Expect(err).NotTo(HaveOccurred())
		return out
	}
	user := func(path string) string {
		out, err := httpGet("http://" + p.Status.PodIP + ":8080" + path)
		g.Expect(err).NotTo(HaveOccurred())
		return out
	}
	g.Expect(qp("/env?name=SERVING_POD_IP")).To(Equal(p.Status.PodIP))
	g.Expect(qp("/env?name=HOST_IP")).To(Equal(p.Status.HostIP))
	g.Expect(qp("/env?name=SERVING_NAMESPACE")).To(Equal(ns))
	g.Expect(qp("/file?path=/etc/podinfo/annotations")).To(Equal(
		"autoscaling.knative.dev/min-scale=\"1\"\nserving.knative.dev/creator=\"admin\""))
	// The user container has no readiness probe of its own (Knative moves
	// it into queue-proxy), so Ready does not mean it listens yet.
	g.Eventually(func() (string, error) { return httpGet("http://" + p.Status.PodIP + ":8080/env?name=K_REVISION") },
		30*time.Second, 100*time.Millisecond).Should(Equal("hello-00001"))
	g.Expect(user("/file?path=/var/run/secrets/kubernetes.io/serviceaccount/namespace")).To(Equal(ns))
	g.Expect(user("/file?path=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")).To(HavePrefix("-----BEGIN CERTIFICATE-----"))
	g.Expect(strings.Count(user("/file?path=/var/run/secrets/kubernetes.io/serviceaccount/token"), ".")).To(Equal(2))
	// The queue-proxy's podinfo is not the user container's.
	_, err = httpGet("http://" + p.Status.PodIP + ":8080/file?path=/etc/podinfo/annotations")
	g.Expect(err).To(HaveOccurred())

	// Deletion: the user container's preStop reaches queue-proxy, then both stop.
	qpLogs, err := client.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "queue-proxy", Follow: true}).Stream(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer qpLogs.Close()
	g.Expect(client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{})).To(Succeed())
	var all strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := qpLogs.Read(buf)
		all.Write(buf[:n])
		if err != nil {
			break
		}
	}
	g.Expect(all.String()).To(ContainSubstring(`hook wait-for-drain called (User-Agent "kube-probe/1.36")`))
	g.Expect(all.String()).To(ContainSubstring("received terminated"))
	g.Eventually(func() bool {
		_, err := client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return err != nil
	}, 30*time.Second, 100*time.Millisecond).Should(BeTrue())
	// (Whether the mount point the agent created on the host goes with the
	// pod is checked by TestDownwardAPIVolume on a path no other suite
	// uses: pods of another agent on the host may mount here too.)
}
