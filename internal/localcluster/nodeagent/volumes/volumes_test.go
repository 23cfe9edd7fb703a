package volumes

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/downward"
)

// A projected token is rewritten once 80% of its lifetime has passed (and
// not before); both tokens are valid for the requested audience.
func TestTokenRefreshedAt80Percent(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `eval \"$(hack/install-deps.sh --env)\"` first")
	}
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	if _, err := client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "fn"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expiry := int64(1000)
	pod, err := client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{
		ServiceAccountName: "fn", Containers: []corev1.Container{{Name: "c", Image: "x"}},
		Volumes: []corev1.Volume{{Name: "tok", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "aud", ExpirationSeconds: &expiry, Path: "token"}}}}}}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	src := Sources{Client: client, ConfigMaps: factory.Core().V1().ConfigMaps().Lister(), Secrets: factory.Core().V1().Secrets().Lister()}
	var mu sync.Mutex
	now := time.Now()
	src.Clock = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	dir := t.TempDir()
	set := New(dir, src, pod, downward.IPs{PodIP: "10.0.0.2", HostIP: "10.0.0.1"})
	read := func() string {
		if err := set.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "tok", "token"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	first := read()
	advance(790 * time.Second)
	if read() != first {
		t.Fatal("token rewritten before 80% of its lifetime")
	}
	advance(20 * time.Second)
	second := read()
	if second == first {
		t.Fatal("token not rewritten after 80% of its lifetime")
	}
	for _, tok := range []string{first, second} {
		r, err := client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: []string{"aud"}}}, metav1.CreateOptions{})
		if err != nil || !r.Status.Authenticated {
			t.Fatalf("token review: %v %+v", err, r.Status)
		}
	}
}

// TestNodePaths: a hostPath under a per-node path resolves into the
// node's own directory (two nodes of one agent do not share it); other
// hostPaths, and paths that merely share a prefix, stay as they are.
func TestNodePaths(t *testing.T) {
	root := t.TempDir()
	dirType := corev1.HostPathDirectoryOrCreate
	pod := &corev1.Pod{Spec: corev1.PodSpec{Volumes: []corev1.Volume{
		{Name: "node", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/ziptrail/node", Type: &dirType}}},
		{Name: "sub", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/ziptrail/node/x/", Type: &dirType}}},
		{Name: "other", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(root, "shared"), Type: &dirType}}},
		{Name: "prefix", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/ziptrail/nodes"}}},
	}}}
	paths := map[string]string{}
	for _, node := range []string{"n1", "n2"} {
		set := New(t.TempDir(), Sources{NodePaths: map[string]string{"/var/run/ziptrail/node": filepath.Join(root, node)}}, pod, downward.IPs{})
		if err := set.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"node", "sub", "other", "prefix"} {
			p, err := set.Path(v)
			if err != nil {
				t.Fatal(err)
			}
			paths[node+"/"+v] = p
		}
	}
	want := map[string]string{
		"n1/node": filepath.Join(root, "n1"), "n2/node": filepath.Join(root, "n2"),
		"n1/sub": filepath.Join(root, "n1", "x"), "n2/sub": filepath.Join(root, "n2", "x"),
		"n1/other": filepath.Join(root, "shared"), "n2/other": filepath.Join(root, "shared"),
		"n1/prefix": "/var/run/ziptrail/nodes", "n2/prefix": "/var/run/ziptrail/nodes",
	}
	for k, w := range want {
		if paths[k] != w {
			t.Errorf("%s: %s, want %s", k, paths[k], w)
		}
	}
	for _, d := range []string{filepath.Join(root, "n1", "x"), filepath.Join(root, "n2", "x")} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			t.Errorf("DirectoryOrCreate did not create %s: %v", d, err)
		}
	}
}

// A memory-backed emptyDir is as large as the least of the node's
// allocatable memory, the pod's memory limit and its sizeLimit.
func TestMemoryVolumeSize(t *testing.T) {
	mi := func(n int64) *resource.Quantity { return resource.NewQuantity(n<<20, resource.BinarySI) }
	pod := func(limits ...int64) *corev1.Pod {
		p := &corev1.Pod{}
		for _, l := range limits {
			c := corev1.Container{}
			if l > 0 {
				c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: *mi(l)}
			}
			p.Spec.Containers = append(p.Spec.Containers, c)
		}
		return p
	}
	alloc := corev1.ResourceList{corev1.ResourceMemory: *mi(4096)}
	for _, tc := range []struct {
		name  string
		alloc corev1.ResourceList
		pod   *corev1.Pod
		limit *resource.Quantity
		want  int64
	}{
		{"sizeLimit", alloc, pod(0), mi(1), 1 << 20},
		{"the pod's limit when lower", alloc, pod(64, 32), mi(512), 96 << 20},
		{"sizeLimit when lower than the pod's", alloc, pod(64, 32), mi(16), 16 << 20},
		{"no pod limit when a container has none", alloc, pod(64, 0), nil, 4096 << 20},
		{"tmpfs default without anything", nil, pod(0), nil, 0},
	} {
		s := New(t.TempDir(), Sources{Allocatable: tc.alloc}, tc.pod, downward.IPs{})
		got, _ := s.memorySize(&corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: tc.limit})
		if got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
