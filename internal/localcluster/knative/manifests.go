package knative

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Module paths whose config/ directories hold Knative Serving's manifests.
// Their versions are the ones go.mod pins.
const (
	ServingModule    = "knative.dev/serving"
	NetworkingModule = "knative.dev/networking"
	CachingModule    = "knative.dev/caching"
)

// Source says where the manifests come from: the module directories (in the
// Go module cache) and the version Knative Serving's images are tagged with.
type Source struct {
	Serving, Networking, Caching string // module directories
	Version                      string // knative.dev/serving's version, e.g. v0.50.0
}

// FindSource asks the go tool for the module directories of the versions
// go.mod pins (downloading them when they are not in the module cache).
func FindSource(ctx context.Context, repoRoot string) (Source, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", ServingModule, NetworkingModule, CachingModule)
	cmd.Dir = repoRoot
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Source{}, fmt.Errorf("go mod download %s %s %s (in %s): %w: %s", ServingModule, NetworkingModule, CachingModule, repoRoot, err, strings.TrimSpace(stderr.String()))
	}
	var src Source
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var m struct{ Path, Version, Dir, Error string }
		if err := dec.Decode(&m); err == io.EOF {
			break
		} else if err != nil {
			return Source{}, fmt.Errorf("go mod download: %w", err)
		}
		if m.Error != "" {
			return Source{}, fmt.Errorf("go mod download %s: %s", m.Path, m.Error)
		}
		switch m.Path {
		case ServingModule:
			src.Serving, src.Version = m.Dir, m.Version
		case NetworkingModule:
			src.Networking = m.Dir
		case CachingModule:
			src.Caching = m.Dir
		}
	}
	if src.Serving == "" || src.Networking == "" || src.Caching == "" {
		return Source{}, fmt.Errorf("go mod download did not report all of %s, %s and %s", ServingModule, NetworkingModule, CachingModule)
	}
	return src, nil
}

// files lists the manifests of Knative Serving's core install (what its
// release's serving-crds.yaml and serving-core.yaml hold): config/core of
// knative.dev/serving, plus the files its repository links in from
// knative.dev/networking (CRDs, config-network) and knative.dev/caching (the
// Image CRD), which module zips do not carry as links.
func (s Source) files() ([]string, error) {
	var files []string
	err := filepath.WalkDir(filepath.Join(s.Serving, "config", "core"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".yaml") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read Knative Serving's config/core: %w", err)
	}
	for _, dir := range []string{s.Networking, s.Caching} {
		m, err := filepath.Glob(filepath.Join(dir, "config", "*.yaml"))
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("no manifests in %s/config", dir)
		}
		files = append(files, m...)
	}
	sort.Strings(files)
	return files, nil
}

// Settings are what the local cluster changes in Knative's own manifests.
type Settings struct {
	// ImageTag replaces the `ko://` of Knative's images: ko://knative.dev/serving/cmd/controller
	// becomes knative.dev/serving/cmd/controller:<ImageTag> (the node
	// agent's image catalog lists those).
	ImageTag string
	// ConfigMaps are set on top of the data of Knative's config maps
	// (config-deployment, config-network, config-domain, config-autoscaler…).
	ConfigMaps map[string]map[string]string
}

// Load reads and adapts the manifests, in the order they must be applied.
func Load(src Source, set Settings) ([]*unstructured.Unstructured, error) {
	files, err := src.files()
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	seen := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		docs, err := decodeAll(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, o := range docs {
			key := o.GetAPIVersion() + "/" + o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
			if prev, dup := seen[key]; dup {
				return nil, fmt.Errorf("%s %s/%s is in both %s and %s", o.GetKind(), o.GetNamespace(), o.GetName(), prev, f)
			}
			seen[key] = f
			o.Object = rewriteImages(o.Object, set.ImageTag).(map[string]any)
			objs = append(objs, o)
		}
	}
	applied := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || set.ConfigMaps[o.GetName()] == nil {
			continue
		}
		data, _, _ := unstructured.NestedStringMap(o.Object, "data")
		if data == nil {
			data = map[string]string{}
		}
		for k, v := range set.ConfigMaps[o.GetName()] {
			data[k] = v
		}
		if err := unstructured.SetNestedStringMap(o.Object, data, "data"); err != nil {
			return nil, err
		}
		applied[o.GetName()] = true
	}
	for name := range set.ConfigMaps {
		if !applied[name] {
			return nil, fmt.Errorf("settings for config map %s, which Knative Serving's manifests do not have", name)
		}
	}
	sort.SliceStable(objs, func(i, j int) bool { return rank(objs[i]) < rank(objs[j]) })
	return objs, nil
}

// rank orders objects as the release files do: namespace, CRDs, RBAC and
// accounts, configuration, workloads, then the webhook configurations (so
// that nothing above waits for a webhook that does not run yet).
func rank(o *unstructured.Unstructured) int {
	switch o.GetKind() {
	case "Namespace":
		return 0
	case "CustomResourceDefinition":
		return 1
	case "ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding":
		return 2
	case "ConfigMap", "Secret":
		return 3
	case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
		return 6
	}
	if o.GetAPIVersion() == "caching.internal.knative.dev/v1alpha1" || strings.HasSuffix(o.GetAPIVersion(), ".knative.dev/v1alpha1") {
		return 5 // custom resources need their CRD established
	}
	return 4
}

func decodeAll(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err == io.EOF {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// rewriteImages turns every "ko://<import path>" string into
// "<import path>:<tag>".
func rewriteImages(v any, tag string) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = rewriteImages(e, tag)
		}
	case []any:
		for i, e := range t {
			t[i] = rewriteImages(e, tag)
		}
	case string:
		if strings.HasPrefix(t, "ko://") {
			return strings.TrimPrefix(t, "ko://") + ":" + tag
		}
	}
	return v
}
