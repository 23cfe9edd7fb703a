package knative

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ziptrail/ziptrail/internal/tools/paths"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func source(t *testing.T) Source {
	t.Helper()
	src, err := FindSource(context.Background(), paths.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// The manifests are Knative's own, from the pinned modules: every object
// of the core install is there, every ko:// image is rewritten to a
// catalog reference, and the settings land in Knative's config maps.
func TestLoadKnativeManifests(t *testing.T) {
	src := source(t)
	if src.Version != "v0.50.0" {
		t.Fatalf("knative.dev/serving %s, want the pinned v0.50.0", src.Version)
	}
	objs, err := Load(src, Settings{ImageTag: src.Version, ConfigMaps: map[string]map[string]string{
		"config-deployment": {"queue-sidecar-image": DefaultQueueSidecarImage},
		"config-autoscaler": {"stable-window": "6s"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		byName[o.GetKind()+"/"+o.GetName()] = o
	}
	for _, want := range []string{
		"Namespace/knative-serving",
		"CustomResourceDefinition/services.serving.knative.dev",
		"CustomResourceDefinition/ingresses.networking.internal.knative.dev",
		"CustomResourceDefinition/serverlessservices.networking.internal.knative.dev",
		"CustomResourceDefinition/images.caching.internal.knative.dev",
		"ConfigMap/config-network",
		"Deployment/controller", "Deployment/webhook", "Deployment/autoscaler", "Deployment/activator",
		"ValidatingWebhookConfiguration/validation.webhook.serving.knative.dev",
	} {
		if byName[want] == nil {
			t.Errorf("%s missing", want)
		}
	}
	for _, o := range objs {
		if raw, _ := o.MarshalJSON(); strings.Contains(string(raw), "ko://") {
			t.Errorf("%s %s still has a ko:// image", o.GetKind(), o.GetName())
		}
	}
	ctrs, _, _ := unstructured.NestedSlice(byName["Deployment/controller"].Object, "spec", "template", "spec", "containers")
	if img := ctrs[0].(map[string]any)["image"]; img != "knative.dev/serving/cmd/controller:v0.50.0" {
		t.Errorf("controller image %v", img)
	}
	data, _, _ := unstructured.NestedStringMap(byName["ConfigMap/config-deployment"].Object, "data")
	if data["queue-sidecar-image"] != DefaultQueueSidecarImage {
		t.Errorf("queue-sidecar-image %q", data["queue-sidecar-image"])
	}
	if data["_example"] == "" {
		t.Error("Knative's own data of config-deployment was dropped")
	}
	data, _, _ = unstructured.NestedStringMap(byName["ConfigMap/config-autoscaler"].Object, "data")
	if data["stable-window"] != "6s" {
		t.Errorf("stable-window %q", data["stable-window"])
	}
	// Order: namespace first, CRDs before custom resources, webhook
	// configurations last.
	if objs[0].GetKind() != "Namespace" {
		t.Errorf("first object %s", objs[0].GetKind())
	}
	if last := objs[len(objs)-1].GetKind(); !strings.HasSuffix(last, "WebhookConfiguration") {
		t.Errorf("last object %s", last)
	}
	seenCR := false
	for _, o := range objs {
		if o.GetKind() == "Image" {
			seenCR = true
		}
		if o.GetKind() == "CustomResourceDefinition" && seenCR {
			t.Errorf("CRD %s after a custom resource", o.GetName())
		}
	}
}

// A setting for a config map Knative does not have is an error, not a
// silently ignored typo.
func TestLoadRejectsUnknownConfigMap(t *testing.T) {
	_, err := Load(source(t), Settings{ImageTag: "v0.50.0", ConfigMaps: map[string]map[string]string{"config-autoscalr": {"stable-window": "6s"}}})
	if err == nil || !strings.Contains(err.Error(), "config-autoscalr") {
		t.Fatalf("err = %v, want one naming config-autoscalr", err)
	}
}

// Two manifests defining the same object are an error.
func TestLoadRejectsDuplicates(t *testing.T) {
	src := source(t)
	dir := t.TempDir()
	extra := filepath.Join(dir, "config")
	if err := os.MkdirAll(extra, 0o755); err != nil {
		t.Fatal(err)
	}
	dup := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: config-network, namespace: knative-serving}\n"
	if err := os.WriteFile(filepath.Join(extra, "dup.yaml"), []byte(dup), 0o644); err != nil {
		t.Fatal(err)
	}
	src.Caching = dir
	_, err := Load(src, Settings{ImageTag: "v0.50.0"})
	if err == nil || !strings.Contains(err.Error(), "config-network") {
		t.Fatalf("err = %v, want a duplicate config-network", err)
	}
}
