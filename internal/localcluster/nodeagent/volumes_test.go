package nodeagent_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Knative's shape: the pod's annotations as a downwardAPI volume at
// /etc/podinfo, in the kubelet's format, updated when they change.
func TestDownwardAPIVolume(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pod := echoPod(ns, "podinfo", nodes[0].Name)
	pod.Annotations = map[string]string{"ziptrail.dev/function": "count", "b": `quote " and \ backslash`}
	pod.Spec.Volumes = []corev1.Volume{{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
		Items: []corev1.DownwardAPIVolumeFile{
			{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}},
			{Path: "fn", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['ziptrail.dev/function']"}},
		}}}}}
	// Knative's path is /etc/podinfo; this one is the suite's own, so the
	// removal of the mount point below is not confused by other agents.
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "podinfo", MountPath: "/etc/ztn-podinfo/info", ReadOnly: true}}
	create(t, pod)
	p := waitReady(t, ns, "podinfo")
	g.Expect(readFile(p, "/etc/ztn-podinfo/info/annotations")).To(Equal(
		"b=\"quote \\\" and \\\\ backslash\"\nziptrail.dev/function=\"count\""))
	g.Expect(readFile(p, "/etc/ztn-podinfo/info/fn")).To(Equal("count"))

	p.Annotations["ziptrail.dev/function"] = "merge"
	_, err := client.CoreV1().Pods(ns).Update(context.Background(), p, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() (string, error) { return readFile(p, "/etc/ztn-podinfo/info/fn") }, 30*time.Second, 200*time.Millisecond).Should(Equal("merge"))

	// Mount points the agent created on the host's filesystem go with the pod.
	g.Expect(client.CoreV1().Pods(ns).Delete(context.Background(), "podinfo", metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(func() bool {
		_, err := client.CoreV1().Pods(ns).Get(context.Background(), "podinfo", metav1.GetOptions{})
		return err != nil
	}, 30*time.Second, 200*time.Millisecond).Should(BeTrue())
	g.Eventually(func() bool { return fileExists("/etc/ztn-podinfo") }, 10*time.Second, 200*time.Millisecond).Should(BeFalse())
}

// ConfigMap and Secret volumes, env from ConfigMap/Secret keys and envFrom;
// a ConfigMap change reaches the mounted file.
func TestConfigMapAndSecret(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	_, err := client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"},
		Data: map[string]string{"greeting": "hello", "level": "info"}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec"},
		Data: map[string][]byte{"password": []byte("s3cret")}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	pod := echoPod(ns, "cfg", nodes[1].Name)
	c := &pod.Spec.Containers[0]
	c.Env = append(c.Env,
		corev1.EnvVar{Name: "GREETING", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "greeting"}}},
		corev1.EnvVar{Name: "PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}, Key: "password"}}},
		corev1.EnvVar{Name: "COMPOSED", Value: "$(GREETING)-$(POD_NAME)"},
	)
	c.EnvFrom = []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
		{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sec"}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
	}
	c.VolumeMounts = []corev1.VolumeMount{
		{Name: "cfg", MountPath: "/etc/ztn-test/cfg"},
		{Name: "sec", MountPath: "/etc/ztn-test/sec", ReadOnly: true},
		{Name: "scratch", MountPath: "/ztn-scratch"},
	}
	create(t, pod)
	p := waitReady(t, ns, "cfg")
	g.Expect(httpGet(echoURL(p, "/env?name=GREETING"))).To(Equal("hello"))
	g.Expect(httpGet(echoURL(p, "/env?name=PASSWORD"))).To(Equal("s3cret"))
	g.Expect(httpGet(echoURL(p, "/env?name=CFG_level"))).To(Equal("info"))
	g.Expect(httpGet(echoURL(p, "/env?name=COMPOSED"))).To(Equal("hello-cfg"))
	g.Expect(readFile(p, "/etc/ztn-test/cfg/greeting")).To(Equal("hello"))
	g.Expect(readFile(p, "/etc/ztn-test/sec/password")).To(Equal("s3cret"))
	mounts, err := readFile(p, "/proc/self/mounts")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mounts).To(MatchRegexp(`(?m)^tmpfs /ztn-scratch tmpfs `))
	g.Expect(mounts).To(MatchRegexp(`(?m) /etc/ztn-test/sec \S+ ro,`))
	// ConfigMap volumes are read-only even without readOnly: true, as the kubelet mounts them.
	g.Expect(mounts).To(MatchRegexp(`(?m) /etc/ztn-test/cfg \S+ ro,`))
	g.Expect(mounts).To(MatchRegexp(`(?m) /ztn-scratch tmpfs rw,`))

	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "cfg", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	cm.Data["greeting"] = "bonjour"
	delete(cm.Data, "level")
	_, err = client.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() (string, error) { return readFile(p, "/etc/ztn-test/cfg/greeting") }, 30*time.Second, 200*time.Millisecond).Should(Equal("bonjour"))
	g.Eventually(func() error { _, err := readFile(p, "/etc/ztn-test/cfg/level"); return err }, 10*time.Second, 200*time.Millisecond).Should(HaveOccurred())
}

// A missing ConfigMap keeps the pod in ContainerCreating with a FailedMount
// event until it appears.
func TestMissingConfigMapWaits(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	pod := echoPod(ns, "waits", nodes[0].Name)
	pod.Spec.Volumes = []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "later"}}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cfg", MountPath: "/etc/ztn-test/later"}}
	p := create(t, pod)
	g.Eventually(func(g Gomega) {
		ev := events(g, p)
		g.Expect(containsLine(ev, `FailedMount: MountVolume.SetUp failed: volume "cfg": configmap "later"`)).To(BeTrue(), "%v", ev)
		p := getPod(g, ns, "waits")
		g.Expect(p.Status.ContainerStatuses[0].State.Waiting).NotTo(BeNil())
		g.Expect(p.Status.ContainerStatuses[0].State.Waiting.Reason).To(Equal("ContainerCreating"))
	}, 30*time.Second, 200*time.Millisecond).Should(Succeed())
	_, err := client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "later"},
		Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	p = waitReady(t, ns, "waits")
	g.Expect(readFile(p, "/etc/ztn-test/later/k")).To(Equal("v"))
}

// A projected service-account token with an audience is minted for the pod
// (TokenRequest bound to it) and accepted by TokenReview for that audience
// only.
func TestProjectedServiceAccountToken(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	expiry := int64(600)
	pod := echoPod(ns, "token", nodes[1].Name)
	pod.Spec.ServiceAccountName = "default"
	pod.Spec.Volumes = []corev1.Volume{{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "ziptrail-control", ExpirationSeconds: &expiry, Path: "token"}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
		}}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "token", MountPath: "/var/run/secrets/ztn-test", ReadOnly: true}}
	create(t, pod)
	p := waitReady(t, ns, "token")
	g.Expect(readFile(p, "/var/run/secrets/ztn-test/namespace")).To(Equal(ns))
	token, err := readFile(p, "/var/run/secrets/ztn-test/token")
	g.Expect(err).NotTo(HaveOccurred())

	review := func(aud string) *authenticationv1.TokenReview {
		r, err := client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{aud}}}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		return r
	}
	r := review("ziptrail-control")
	g.Expect(r.Status.Authenticated).To(BeTrue(), "error: %s", r.Status.Error)
	g.Expect(r.Status.Audiences).To(ConsistOf("ziptrail-control"))
	g.Expect(r.Status.User.Username).To(Equal("system:serviceaccount:" + ns + ":default"))
	g.Expect(r.Status.User.Extra["authentication.kubernetes.io/pod-name"]).To(ConsistOf("token"))
	g.Expect(r.Status.User.Extra["authentication.kubernetes.io/pod-uid"]).To(ConsistOf(string(p.UID)))
	// Another audience is refused: the token is not a general credential.
	g.Expect(review("some-other-service").Status.Authenticated).To(BeFalse())
}
