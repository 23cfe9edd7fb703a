package localserving

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"github.com/ziptrail/ziptrail/internal/netns"
	"github.com/ziptrail/ziptrail/internal/nodeagent/catalog"
)

// testCatalog writes a catalog rooted at /srv/repo.
func testCatalog(t *testing.T) *catalog.Catalog {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "images.yaml")
	if err := os.WriteFile(path, []byte(`
root: /srv/repo
images:
  - image: example.dev/py:3
    entrypoint: [python3]
    env: [{name: PYTHONPATH, value: sdk/python}, {name: MODE, value: image}]
  - image: example.dev/fn
    entrypoint: [python3, fn.py]
    args: [serve]
    workingDir: examples/fn
`), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := catalog.Load(path, filepath.Join(dir, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ksvc(c corev1.Container) *servingv1.Service {
	svc := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Name: "f", Namespace: "ns", Generation: 3}}
	svc.Spec.Template.Spec.Containers = []corev1.Container{c}
	return svc
}

// A container runs as the node agent would run it: the catalog's
// entrypoint, args and workingDir unless the container overrides them, the
// image's env under the container's.
func TestPodSpecFromCatalog(t *testing.T) {
	r := &Runtime{opts: Options{Catalog: testCatalog(t)}}
	for _, tc := range []struct {
		name    string
		c       corev1.Container
		argv    []string
		dir     string
		env     []string
		wantEnv map[string]string
	}{
		{
			name: "inline code",
			c:    corev1.Container{Image: "example.dev/py:3", Command: []string{"python3", "-c", "print(1)"}, Env: []corev1.EnvVar{{Name: "MODE", Value: "container"}}},
			argv: []string{"python3", "-c", "print(1)"}, dir: "/srv/repo",
			wantEnv: map[string]string{"PYTHONPATH": "sdk/python", "MODE": "container"},
		},
		{
			name: "a role as the argument",
			c:    corev1.Container{Image: "example.dev/fn:latest", Args: []string{"map"}},
			argv: []string{"python3", "fn.py", "map"}, dir: "/srv/repo/examples/fn",
		},
		{
			name: "the image's default args",
			c:    corev1.Container{Image: "example.dev/fn@sha256:0123"},
			argv: []string{"python3", "fn.py", "serve"}, dir: "/srv/repo/examples/fn",
		},
		{
			name: "the container's workingDir",
			c:    corev1.Container{Image: "example.dev/fn", Command: []string{"/bin/true"}, WorkingDir: "/tmp"},
			argv: []string{"/bin/true"}, dir: "/tmp",
		},
	} {
		spec, _, err := r.podSpecFor(context.Background(), ksvc(tc.c))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !reflect.DeepEqual(spec.command, tc.argv) || spec.workingDir != tc.dir {
			t.Errorf("%s: argv %q in %q; want %q in %q", tc.name, spec.command, spec.workingDir, tc.argv, tc.dir)
		}
		if spec.revision != "f-00003" || spec.service != "f" || spec.namespace != "ns" {
			t.Errorf("%s: revision %s/%s/%s", tc.name, spec.namespace, spec.service, spec.revision)
		}
		// exec keeps the last of duplicate variables: the container's win.
		got := map[string]string{}
		for _, kv := range spec.env {
			k, v, _ := strings.Cut(kv, "=")
			got[k] = v
		}
		for k, v := range tc.wantEnv {
			if got[k] != v {
				t.Errorf("%s: env %s = %q, want %q (env %q)", tc.name, k, got[k], v, spec.env)
			}
		}
	}
}

func TestPodSpecErrors(t *testing.T) {
	cat := testCatalog(t)
	r := &Runtime{opts: Options{Catalog: cat}}
	for name, tc := range map[string]struct {
		svc  *servingv1.Service
		want []string
	}{
		"an image not in the catalog": {ksvc(corev1.Container{Image: "example.dev/missing:1"}),
			[]string{"ErrImagePull", `"example.dev/missing:1"`, cat.Path}},
		"no image": {ksvc(corev1.Container{}), []string{"no image"}},
		"no container": {&servingv1.Service{ObjectMeta: metav1.ObjectMeta{Name: "f", Namespace: "ns"}},
			[]string{"no container"}},
		"env from a secret": {ksvc(corev1.Container{Image: "example.dev/py:3", Env: []corev1.EnvVar{{Name: "TOKEN",
			ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "t"}}}}}),
			[]string{"env TOKEN", "valueFrom"}},
		"envFrom": {ksvc(corev1.Container{Image: "example.dev/py:3", EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{}}}}),
			[]string{"envFrom"}},
	} {
		_, _, err := r.podSpecFor(context.Background(), tc.svc)
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", name, err, w)
			}
		}
	}
}

func TestNewNeedsACatalog(t *testing.T) {
	network, err := netns.New("ztx", netip.MustParsePrefix("10.219.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Network: network, QueueProxy: "q", StateDir: "s", ShmRoot: "m"}
	if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "Catalog") {
		t.Fatalf("New without a catalog: %v", err)
	}
	opts.Catalog = testCatalog(t)
	if _, err := New(opts); err != nil {
		t.Fatalf("New with a catalog: %v", err)
	}
}
