// Package volumes materialises a pod's volumes in its sandbox directory on
// the host, as the kubelet's volume plugins do, and keeps them current:
// emptyDir (medium Memory as a tmpfs of the kubelet's size), hostPath,
// ConfigMap, Secret, downwardAPI and projected volumes, including
// service-account tokens minted with the TokenRequest API (audience, expiry,
// bound to the pod) and rewritten at 80% of their lifetime. Files are
// written atomically (temp file then rename) and only when their content
// changes; keys that disappear are removed.
package volumes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/downward"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/limits"
)

// Sources is where volume contents come from.
type Sources struct {
	Client      kubernetes.Interface
	ConfigMaps  corev1listers.ConfigMapLister
	Secrets     corev1listers.SecretLister
	Allocatable corev1.ResourceList // for resourceFieldRef without a limit
	// Clock is the time source of token refreshes (nil: time.Now).
	Clock func() time.Time
	// NodePaths maps hostPath paths to this node's own directory: one
	// agent runs several nodes on one host, and a directory that is per
	// node on a real cluster (ziptrail's same-node socket directory) must
	// not be shared between them. A hostPath equal to a key, or below it,
	// resolves under the value.
	NodePaths map[string]string
}

// hostPathOf is where a hostPath volume's path is on this host.
func (s *Set) hostPathOf(p string) string {
	clean := filepath.Clean(p)
	for from, to := range s.src.NodePaths {
		if rel, err := filepath.Rel(from, clean); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return filepath.Join(to, rel)
		}
	}
	return p
}

func (s *Set) now() time.Time {
	if s.src.Clock != nil {
		return s.src.Clock()
	}
	return time.Now()
}

// Set is the volumes of one pod.
type Set struct {
	dir string // <sandbox>/volumes
	src Sources
	ips downward.IPs

	mu      sync.Mutex
	pod     *corev1.Pod
	written map[string]map[string]bool // volume -> relative paths written
	tokens  map[string]*token          // volume/path -> token
	mounted map[string]bool            // memory emptyDirs mounted
}

type token struct {
	value     []byte
	refreshAt time.Time
}

// New prepares the volumes of a pod under dir.
func New(dir string, src Sources, pod *corev1.Pod, ips downward.IPs) *Set {
	return &Set{dir: dir, src: src, ips: ips, pod: pod.DeepCopy(),
		written: map[string]map[string]bool{}, tokens: map[string]*token{}, mounted: map[string]bool{}}
}

// SetPod replaces the pod's metadata (labels and annotations feed downward
// API files); call Sync afterwards.
func (s *Set) SetPod(pod *corev1.Pod) {
	s.mu.Lock()
	s.pod = pod.DeepCopy()
	s.mu.Unlock()
}

// Path is the host directory (or file, for hostPath) of a volume.
func (s *Set) Path(name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.pod.Spec.Volumes {
		if v.Name != name {
			continue
		}
		if v.HostPath != nil {
			return s.hostPathOf(v.HostPath.Path), nil
		}
		return filepath.Join(s.dir, v.Name), nil
	}
	return "", fmt.Errorf("volume %q is not defined in the pod", name)
}

// ReadOnly reports whether the kubelet always mounts a volume read-only
// (the API-projected kinds: configMap, secret, downwardAPI, projected).
func (s *Set) ReadOnly(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.pod.Spec.Volumes {
		if v.Name == name {
			return v.ConfigMap != nil || v.Secret != nil || v.DownwardAPI != nil || v.Projected != nil
		}
	}
	return false
}

// Sync creates or refreshes every volume. It fails (and should be retried)
// when a required ConfigMap, Secret or key is missing or a token cannot be
// minted; the kubelet then keeps the pod in ContainerCreating.
func (s *Set) Sync(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, v := range s.pod.Spec.Volumes {
		if err := s.syncVolume(ctx, v); err != nil {
			errs = append(errs, fmt.Errorf("volume %q: %w", v.Name, err))
		}
	}
	return errors.Join(errs...)
}

// NextTokenRefresh is when the earliest token should be rewritten (zero when
// the pod has no token).
func (s *Set) NextTokenRefresh() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var next time.Time
	for _, t := range s.tokens {
		if next.IsZero() || t.refreshAt.Before(next) {
			next = t.refreshAt
		}
	}
	return next
}

type file struct {
	data []byte
	mode os.FileMode
}

func (s *Set) syncVolume(ctx context.Context, v corev1.Volume) error {
	dir := filepath.Join(s.dir, v.Name)
	switch {
	case v.EmptyDir != nil:
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return err
		}
		_ = os.Chmod(dir, 0o777)
		if v.EmptyDir.Medium == corev1.StorageMediumMemory && !s.mounted[v.Name] {
			opts := "mode=1777"
			if size, ok := s.memorySize(v.EmptyDir); ok {
				opts += ",size=" + strconv.FormatInt(size, 10)
			}
			if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
				return fmt.Errorf("mount tmpfs: %w", err)
			}
			s.mounted[v.Name] = true
		}
		return nil
	case v.HostPath != nil:
		h := *v.HostPath
		h.Path = s.hostPathOf(h.Path)
		return hostPath(&h)
	case v.ConfigMap != nil:
		files, err := s.configMap(v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, mode(v.ConfigMap.DefaultMode))
		if err != nil {
			return err
		}
		return s.write(v.Name, dir, files)
	case v.Secret != nil:
		files, err := s.secret(v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, mode(v.Secret.DefaultMode))
		if err != nil {
			return err
		}
		return s.write(v.Name, dir, files)
	case v.DownwardAPI != nil:
		files, err := s.downwardAPI(v.DownwardAPI.Items, mode(v.DownwardAPI.DefaultMode))
		if err != nil {
			return err
		}
		return s.write(v.Name, dir, files)
	case v.Projected != nil:
		files, err := s.projected(ctx, v.Name, v.Projected)
		if err != nil {
			return err
		}
		return s.write(v.Name, dir, files)
	}
	return fmt.Errorf("this volume type is not supported by ziptrail-node (supported: emptyDir, hostPath, configMap, secret, downwardAPI, projected)")
}

// memorySize is a memory-backed emptyDir's tmpfs size, as the kubelet
// sizes it: the least of the node's allocatable memory, the pod's memory
// limit (when every container has one) and the volume's sizeLimit. Its
// pages are charged to the memory cgroup of the container that writes them.
func (s *Set) memorySize(e *corev1.EmptyDirVolumeSource) (int64, bool) {
	var size int64
	lower := func(v int64) {
		if v > 0 && (size == 0 || v < size) {
			size = v
		}
	}
	if m, ok := s.src.Allocatable[corev1.ResourceMemory]; ok {
		lower(m.Value())
	}
	if m, ok := limits.PodMemory(s.pod); ok {
		lower(m)
	}
	if l := e.SizeLimit; l != nil {
		lower(l.Value())
	}
	return size, size > 0
}

func mode(m *int32) os.FileMode {
	if m == nil {
		return 0o644
	}
	return os.FileMode(*m) & 0o777
}

func itemMode(m *int32, def os.FileMode) os.FileMode {
	if m == nil {
		return def
	}
	return os.FileMode(*m) & 0o777
}

func hostPath(h *corev1.HostPathVolumeSource) error {
	t := corev1.HostPathUnset
	if h.Type != nil {
		t = *h.Type
	}
	switch t {
	case corev1.HostPathDirectoryOrCreate:
		return os.MkdirAll(h.Path, 0o755)
	case corev1.HostPathFileOrCreate:
		if err := os.MkdirAll(filepath.Dir(h.Path), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(h.Path, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	case corev1.HostPathUnset:
		return nil
	}
	if _, err := os.Stat(h.Path); err != nil {
		return fmt.Errorf("hostPath %s: %w", h.Path, err)
	}
	return nil
}

func (s *Set) configMap(name string, items []corev1.KeyToPath, optional *bool, def os.FileMode) (map[string]file, error) {
	cm, err := s.src.ConfigMaps.ConfigMaps(s.pod.Namespace).Get(name)
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return map[string]file{}, nil
		}
		return nil, fmt.Errorf("configmap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return project(data, items, optional, def, "configmap "+name)
}

func (s *Set) secret(name string, items []corev1.KeyToPath, optional *bool, def os.FileMode) (map[string]file, error) {
	sec, err := s.src.Secrets.Secrets(s.pod.Namespace).Get(name)
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return map[string]file{}, nil
		}
		return nil, fmt.Errorf("secret %q: %w", name, err)
	}
	return project(sec.Data, items, optional, def, "secret "+name)
}

// project selects keys (all of them, or the listed items) as files.
func project(data map[string][]byte, items []corev1.KeyToPath, optional *bool, def os.FileMode, what string) (map[string]file, error) {
	files := map[string]file{}
	if len(items) == 0 {
		for k, v := range data {
			files[k] = file{v, def}
		}
		return files, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional != nil && *optional {
				continue
			}
			return nil, fmt.Errorf("%s has no key %q", what, it.Key)
		}
		files[it.Path] = file{v, itemMode(it.Mode, def)}
	}
	return files, nil
}

func (s *Set) downwardAPI(items []corev1.DownwardAPIVolumeFile, def os.FileMode) (map[string]file, error) {
	files := map[string]file{}
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = downward.Field(s.pod, s.ips, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			v, err = downward.Resource(s.pod, "", it.ResourceFieldRef, s.src.Allocatable)
		default:
			err = fmt.Errorf("item %q has neither fieldRef nor resourceFieldRef", it.Path)
		}
		if err != nil {
			return nil, err
		}
		files[it.Path] = file{[]byte(v), itemMode(it.Mode, def)}
	}
	return files, nil
}

func (s *Set) projected(ctx context.Context, volume string, p *corev1.ProjectedVolumeSource) (map[string]file, error) {
	def := mode(p.DefaultMode)
	files := map[string]file{}
	for _, src := range p.Sources {
		var part map[string]file
		var err error
		switch {
		case src.ConfigMap != nil:
			part, err = s.configMap(src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional, def)
		case src.Secret != nil:
			part, err = s.secret(src.Secret.Name, src.Secret.Items, src.Secret.Optional, def)
		case src.DownwardAPI != nil:
			part, err = s.downwardAPI(src.DownwardAPI.Items, def)
		case src.ServiceAccountToken != nil:
			var data []byte
			data, err = s.token(ctx, volume, src.ServiceAccountToken)
			part = map[string]file{src.ServiceAccountToken.Path: {data, def}}
		default:
			err = fmt.Errorf("unsupported projected source (supported: configMap, secret, downwardAPI, serviceAccountToken)")
		}
		if err != nil {
			return nil, err
		}
		for k, v := range part {
			files[k] = v
		}
	}
	return files, nil
}

// token returns the current token of a serviceAccountToken projection,
// requesting a new one when there is none or 80% of its lifetime has passed.
func (s *Set) token(ctx context.Context, volume string, p *corev1.ServiceAccountTokenProjection) ([]byte, error) {
	key := volume + "/" + p.Path
	if t, ok := s.tokens[key]; ok && s.now().Before(t.refreshAt) {
		return t.value, nil
	}
	expiry := int64(3600)
	if p.ExpirationSeconds != nil {
		expiry = *p.ExpirationSeconds
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &expiry,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: s.pod.Name, UID: s.pod.UID},
	}}
	if p.Audience != "" {
		req.Spec.Audiences = []string{p.Audience}
	}
	sa := s.pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	resp, err := s.src.Client.CoreV1().ServiceAccounts(s.pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("request a token for service account %s/%s: %w", s.pod.Namespace, sa, err)
	}
	now := s.now()
	lifetime := resp.Status.ExpirationTimestamp.Sub(time.Now())
	if lifetime <= 0 {
		lifetime = time.Duration(expiry) * time.Second
	}
	refresh := lifetime * 8 / 10
	if refresh > 24*time.Hour {
		refresh = 24 * time.Hour
	}
	t := &token{value: []byte(resp.Status.Token), refreshAt: now.Add(refresh)}
	s.tokens[key] = t
	return t.value, nil
}

// write brings a volume directory to exactly the given files.
func (s *Set) write(volume, dir string, files map[string]file) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old := s.written[volume]
	now := map[string]bool{}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		f := files[p]
		full, err := within(dir, p)
		if err != nil {
			return err
		}
		if err := writeIfChanged(full, f); err != nil {
			return err
		}
		now[p] = true
	}
	for p := range old {
		if !now[p] {
			if full, err := within(dir, p); err == nil {
				_ = os.Remove(full)
			}
		}
	}
	s.written[volume] = now
	return nil
}

// within joins a relative item path to dir, refusing paths that escape it.
func within(dir, p string) (string, error) {
	full := filepath.Join(dir, p)
	if filepath.IsAbs(p) || (full != dir && !bytes.HasPrefix([]byte(full), []byte(dir+string(filepath.Separator)))) {
		return "", fmt.Errorf("item path %q escapes the volume", p)
	}
	return full, nil
}

func writeIfChanged(path string, f file) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, f.data) {
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm() == f.mode {
			return nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(f.data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(f.mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
