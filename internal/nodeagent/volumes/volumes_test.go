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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ziptrail/ziptrail/internal/nodeagent/downward"
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
