package nodeagent

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/catalog"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/downward"
)

// containerEnv builds a container's environment as a container runtime
// under the kubelet would: the image's env (from the catalog), overridden by
// the service link variables, envFrom and env (with $(VAR) expansion and
// valueFrom resolved here, after the sandbox has its IP).
func (p *Provider) containerEnv(pod *corev1.Pod, c *corev1.Container, img []catalog.EnvVar, ips downward.IPs) ([]string, map[string]string, error) {
	vars := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	for k, v := range p.serviceEnv(pod) {
		set(k, v)
	}
	sort.Strings(order)
	ns := pod.Namespace
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := p.cfg.ConfigMaps.ConfigMaps(ns).Get(from.ConfigMapRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional {
					continue
				}
				return nil, nil, fmt.Errorf("configmap %q: %w", from.ConfigMapRef.Name, err)
			}
			for _, k := range sortedKeys(cm.Data) {
				set(from.Prefix+k, cm.Data[k])
			}
		case from.SecretRef != nil:
			s, err := p.cfg.Secrets.Secrets(ns).Get(from.SecretRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && from.SecretRef.Optional != nil && *from.SecretRef.Optional {
					continue
				}
				return nil, nil, fmt.Errorf("secret %q: %w", from.SecretRef.Name, err)
			}
			keys := make([]string, 0, len(s.Data))
			for k := range s.Data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				set(from.Prefix+k, string(s.Data[k]))
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, vars))
			continue
		}
		v, ok, err := p.valueFrom(pod, c, e.ValueFrom, ips)
		if err != nil {
			return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}
	// The image's environment lies underneath.
	base := map[string]string{
		"PATH":     os.Getenv("PATH"),
		"HOME":     "/root",
		"HOSTNAME": hostname(pod),
	}
	if base["PATH"] == "" {
		base["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	for _, e := range img {
		base[e.Name] = e.Value
	}
	var env []string
	for _, k := range sortedKeys(base) {
		if _, ok := vars[k]; !ok {
			env = append(env, k+"="+base[k])
		}
	}
	for _, k := range order {
		env = append(env, k+"="+vars[k])
	}
	return env, vars, nil
}

func (p *Provider) valueFrom(pod *corev1.Pod, c *corev1.Container, src *corev1.EnvVarSource, ips downward.IPs) (string, bool, error) {
	ns := pod.Namespace
	switch {
	case src.FieldRef != nil:
		v, err := downward.Field(pod, ips, src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.ResourceFieldRef != nil:
		v, err := downward.Resource(pod, c.Name, src.ResourceFieldRef, p.allocatable)
		return v, err == nil, err
	case src.ConfigMapKeyRef != nil:
		r := src.ConfigMapKeyRef
		optional := r.Optional != nil && *r.Optional
		cm, err := p.cfg.ConfigMaps.ConfigMaps(ns).Get(r.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configmap %q: %w", r.Name, err)
		}
		v, ok := cm.Data[r.Key]
		if !ok {
			if b, okb := cm.BinaryData[r.Key]; okb {
				return string(b), true, nil
			}
			if optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", r.Key, ns, r.Name)
		}
		return v, true, nil
	case src.SecretKeyRef != nil:
		r := src.SecretKeyRef
		optional := r.Optional != nil && *r.Optional
		s, err := p.cfg.Secrets.Secrets(ns).Get(r.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %q: %w", r.Name, err)
		}
		v, ok := s.Data[r.Key]
		if !ok {
			if optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("couldn't find key %s in Secret %s/%s", r.Key, ns, r.Name)
		}
		return string(v), true, nil
	}
	return "", false, fmt.Errorf("unsupported valueFrom")
}

// serviceEnv returns the docker-links style variables of the Services the
// kubelet exposes to a pod: the master service always, and the Services of
// the pod's namespace unless enableServiceLinks is false.
func (p *Provider) serviceEnv(pod *corev1.Pod) map[string]string {
	env := map[string]string{}
	links := pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
	svcs, err := p.cfg.Services.List(labels.Everything())
	if err != nil {
		return env
	}
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].Name < svcs[j].Name })
	for _, s := range svcs {
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		master := s.Namespace == "default" && s.Name == "kubernetes"
		if !master && !(links && s.Namespace == pod.Namespace) {
			continue
		}
		name := strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
		if len(s.Spec.Ports) == 0 {
			continue
		}
		env[name+"_SERVICE_HOST"] = s.Spec.ClusterIP
		env[name+"_SERVICE_PORT"] = strconv.Itoa(int(s.Spec.Ports[0].Port))
		for i, sp := range s.Spec.Ports {
			if sp.Name != "" {
				env[name+"_SERVICE_PORT_"+strings.ToUpper(strings.ReplaceAll(sp.Name, "-", "_"))] = strconv.Itoa(int(sp.Port))
			}
			proto := strings.ToLower(string(sp.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			url := fmt.Sprintf("%s://%s:%d", proto, s.Spec.ClusterIP, sp.Port)
			if i == 0 {
				env[name+"_PORT"] = url
			}
			prefix := fmt.Sprintf("%s_PORT_%d_%s", name, sp.Port, strings.ToUpper(proto))
			env[prefix] = url
			env[prefix+"_PROTO"] = proto
			env[prefix+"_PORT"] = strconv.Itoa(int(sp.Port))
			env[prefix+"_ADDR"] = s.Spec.ClusterIP
		}
	}
	return env
}

// expand replaces $(VAR) references with defined variables; $$ escapes.
func expand(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func expandAll(in []string, vars map[string]string) []string {
	if in == nil {
		return nil
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = expand(s, vars)
	}
	return out
}

func hostname(pod *corev1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	return pod.Name
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
