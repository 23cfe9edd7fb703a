package podwebhook

import (
	"context"
	"fmt"
	"os"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

func TestConstantsMatchTheDataPlane(t *testing.T) {
	if DefaultHostDir != samenode.DefaultDir || envDir != samenode.EnvDir || envNode != samenode.EnvNode || envPodUID != samenode.EnvPodUID {
		t.Fatal("podwebhook's directory or variable names differ from internal/dataplane/samenode's")
	}
}

func pod(name string, labels map[string]string, containers ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels}}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "example.com/" + c})
	}
	return p
}

var revisionLabels = map[string]string{labelRevision: "fn-00001", labelWorkflow: "wf"}

// TestWebhookEnvtest: a real API server calls the webhook (served over
// TLS, registered as the chart registers it: objectSelector, failurePolicy
// Ignore); only queue-proxy of a ziptrail revision pod gets the mount.
func TestWebhookEnvtest(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `eval \"$(hack/install-deps.sh --env)\"` first")
	}
	hook := func(name, path string) admissionv1.MutatingWebhook {
		return Registration(name, admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Name: "ziptrail-webhook", Namespace: "ziptrail-system", Path: &path}})
	}
	env := &envtest.Environment{WebhookInstallOptions: envtest.WebhookInstallOptions{
		MutatingWebhooks: []*admissionv1.MutatingWebhookConfiguration{{
			ObjectMeta: metav1.ObjectMeta{Name: "ziptrail-pods"},
			TypeMeta:   metav1.TypeMeta{Kind: "MutatingWebhookConfiguration", APIVersion: "admissionregistration.k8s.io/v1"},
			// As the chart registers them: the objects volume for every
			// namespace, the node directory where it is enabled.
			Webhooks: []admissionv1.MutatingWebhook{hook(ObjectsWebhook, ObjectsPath), hook(SameNodeWebhook, Path)},
		}},
	}}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	o := env.WebhookInstallOptions
	srv := webhook.NewServer(webhook.Options{Host: o.LocalServingHost, Port: o.LocalServingPort, CertDir: o.LocalServingCertDir})
	srv.Register(Path, &webhook.Admission{Handler: &Mutator{}})
	srv.Register(ObjectsPath, &webhook.Admission{Handler: ObjectsMutator{}})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = srv.Start(ctx) }()

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	// The server starts asynchronously: failurePolicy Ignore admits pods
	// unchanged until it answers, so create probes until one is mutated.
	var got corev1.Pod
	for i := 0; ; i++ {
		p := objectsPod(fmt.Sprintf("probe-%d", i))
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if len(p.Spec.Volumes) == 2 {
			got = *p
			break
		}
		if i > 3000 {
			t.Fatal("the webhook never mutated a revision pod")
		}
	}
	check := func(p *corev1.Pod) {
		t.Helper()
		var vol *corev1.Volume
		for i := range p.Spec.Volumes {
			if p.Spec.Volumes[i].Name == VolumeName {
				vol = &p.Spec.Volumes[i]
			}
		}
		if vol == nil || vol.HostPath == nil || vol.HostPath.Path != DefaultHostDir || *vol.HostPath.Type != corev1.HostPathDirectoryOrCreate {
			t.Fatalf("volume %+v", vol)
		}
		for _, ctr := range p.Spec.Containers {
			mounted := false
			for _, m := range ctr.VolumeMounts {
				mounted = mounted || m.Name == VolumeName
			}
			if !mountsObjects(ctr) {
				t.Errorf("container %s lacks the objects volume: %+v", ctr.Name, ctr.VolumeMounts)
			}
			env := map[string]corev1.EnvVar{}
			for _, e := range ctr.Env {
				env[e.Name] = e
			}
			switch ctr.Name {
			case QueueProxy:
				if !mounted {
					t.Error("queue-proxy lacks the node directory")
				}
				if env[envNode].ValueFrom == nil || env[envNode].ValueFrom.FieldRef.FieldPath != "spec.nodeName" ||
					env[envPodUID].ValueFrom == nil || env[envPodUID].ValueFrom.FieldRef.FieldPath != "metadata.uid" || env[envDir].Value != DefaultHostDir {
					t.Errorf("queue-proxy env %+v", ctr.Env)
				}
			default:
				if mounted || len(ctr.Env) != 0 {
					t.Errorf("container %s got the mount or env: %+v %+v", ctr.Name, ctr.VolumeMounts, ctr.Env)
				}
			}
		}
	}
	check(&got)
	checkObjects(t, &got)

	// Untouched: a pod without Knative's revision label, a Knative pod of
	// a non-ziptrail service, and a revision pod without queue-proxy.
	for _, p := range []*corev1.Pod{
		pod("plain", map[string]string{"app": "x"}, "main", QueueProxy),
		pod("knative-other", map[string]string{labelRevision: "other-00001"}, "user-container", QueueProxy),
		pod("no-qp", revisionLabels, "user-container"),
	} {
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if len(p.Spec.Volumes) != 0 {
			t.Errorf("%s: got volumes %+v", p.Name, p.Spec.Volumes)
		}
		for _, ctr := range p.Spec.Containers {
			if len(ctr.VolumeMounts) != 0 || len(ctr.Env) != 0 {
				t.Errorf("%s/%s mutated: %+v %+v", p.Name, ctr.Name, ctr.VolumeMounts, ctr.Env)
			}
		}
	}
}

// TestMutateIdempotent: a reinvoked webhook changes nothing more, and an
// existing variable of the same name is replaced, not duplicated.
func TestMutateIdempotent(t *testing.T) {
	p := pod("x", revisionLabels, "user-container", QueueProxy)
	p.Spec.Containers[1].Env = []corev1.EnvVar{{Name: envNode, Value: "spoofed"}}
	m := &Mutator{}
	if !m.Mutate(p) {
		t.Fatal("not mutated")
	}
	if m.Mutate(p) {
		t.Fatal("mutated twice")
	}
	n := 0
	for _, e := range p.Spec.Containers[1].Env {
		if e.Name == envNode {
			n++
			if e.ValueFrom == nil {
				t.Error("a preset node name survived")
			}
		}
	}
	if n != 1 || len(p.Spec.Volumes) != 1 {
		t.Fatalf("env %+v volumes %+v", p.Spec.Containers[1].Env, p.Spec.Volumes)
	}
}
