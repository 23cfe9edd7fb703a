package knativeconfig

// The chart's hook commands: `operator knative-config` (post-install and
// post-upgrade) points Knative Serving at ziptrail's images, and
// `operator knative-restore` (post-delete) puts back what it changed. They
// run in the operator's own image, so the chart needs no other image.
//
// What they change, and the original values they keep to restore:
//
//   - config-deployment: queue-sidecar-image (queue-proxy-zl), and the
//     control stream's token audience added to
//     queue-sidecar-token-audiences (Knative then mounts a projected token
//     for it into every queue-proxy);
//   - config-features: queueproxy.mount-podinfo=enabled (queue-proxy-zl
//     reads the revision's annotations);
//   - with activator-ext: the image, ziptrail's env and a projected token
//     volume of the activator container in Knative's activator Deployment.
//
// The original values are kept in the annotation savedAnnotation of each
// object, written the first time a key is changed, so upgrades keep the
// values from before the install, and knative-restore (or an upgrade that
// turns the part off) writes them back and removes the annotation.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/ziptrail/ziptrail/internal/operator/app"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// savedAnnotation holds, as JSON, the values an object had before the hook
// changed it (a config map's keys, null for a key that was absent; the
// activator's container).
const savedAnnotation = "ziptrail.dev/saved-before-ziptrail"

// tokenVolume is the projected service-account token the hook adds to
// Knative's activator for activator-ext's calls to the control service.
const tokenVolume = "ziptrail-control-token"

type knativeConfig struct {
	namespace string
	// queue-proxy: config-deployment and config-features.
	queueProxy     bool
	queueImage     string
	tokenAudience  string
	activator      bool
	deployment     string
	activatorImage string
	activatorEnv   []corev1.EnvVar
}

// HookCommand runs a hook subcommand when args name one; ok is false
// otherwise.
func HookCommand(args []string) (ok bool, err error) {
	if len(args) == 0 {
		return false, nil
	}
	switch args[0] {
	case "knative-config":
		return true, runKnativeConfig(args[1:])
	case "knative-restore":
		return true, runKnativeRestore(args[1:])
	}
	return false, nil
}

type envFlag struct{ env *[]corev1.EnvVar }

func (f envFlag) String() string { return "" }
func (f envFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not NAME=VALUE", v)
	}
	*f.env = append(*f.env, corev1.EnvVar{Name: k, Value: val})
	return nil
}

func runKnativeConfig(args []string) error {
	var c knativeConfig
	fs := flag.NewFlagSet("knative-config", flag.ContinueOnError)
	fs.StringVar(&c.namespace, "knative-namespace", "knative-serving", "namespace of Knative Serving")
	fs.BoolVar(&c.queueProxy, "queue-proxy", true, "set queue-sidecar-image, the token audience and mount-podinfo (false: restore them)")
	fs.StringVar(&c.queueImage, "queue-sidecar-image", "", "image of queue-proxy-zl")
	fs.StringVar(&c.tokenAudience, "token-audience", controlv1.Audience, "audience added to queue-sidecar-token-audiences")
	fs.BoolVar(&c.activator, "activator-ext", false, "run activator-ext in Knative's activator Deployment (false: restore it)")
	fs.StringVar(&c.deployment, "activator-deployment", "activator", "Knative's activator Deployment and container name")
	fs.StringVar(&c.activatorImage, "activator-image", "", "image of activator-ext")
	fs.Var(envFlag{&c.activatorEnv}, "activator-env", "NAME=VALUE set on the activator container (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.queueProxy && c.queueImage == "" {
		return errors.New("--queue-sidecar-image is required with --queue-proxy")
	}
	if c.activator && c.activatorImage == "" {
		return errors.New("--activator-image is required with --activator-ext")
	}
	cs, err := hookClient()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return applyKnativeConfig(ctx, cs, c)
}

// applyKnativeConfig makes Knative's objects as c says, saving their
// values from before the first change, or restoring them for a part c
// turns off.
func applyKnativeConfig(ctx context.Context, cs kubernetes.Interface, c knativeConfig) error {
	if c.queueProxy {
		if err := updateConfigMap(ctx, cs, c.namespace, "config-deployment", func(data map[string]string) map[string]*string {
			return map[string]*string{
				"queue-sidecar-image":           &c.queueImage,
				"queue-sidecar-token-audiences": ptr(addToList(data["queue-sidecar-token-audiences"], c.tokenAudience)),
			}
		}); err != nil {
			return err
		}
		if err := updateConfigMap(ctx, cs, c.namespace, "config-features", func(map[string]string) map[string]*string {
			return map[string]*string{"queueproxy.mount-podinfo": ptr("enabled")}
		}); err != nil {
			return err
		}
		fmt.Printf("knative-config: queue-sidecar-image=%s, token audience %s, queueproxy.mount-podinfo=enabled\n", c.queueImage, c.tokenAudience)
	} else {
		for _, name := range []string{"config-deployment", "config-features"} {
			if err := restoreConfigMap(ctx, cs, c.namespace, name); err != nil {
				return err
			}
		}
	}
	if c.activator {
		if err := swapActivator(ctx, cs, c); err != nil {
			return err
		}
		fmt.Printf("knative-config: deployment %s/%s runs %s\n", c.namespace, c.deployment, c.activatorImage)
	} else if err := restoreActivator(ctx, cs, c.namespace, c.deployment); err != nil {
		return err
	}
	return nil
}

func runKnativeRestore(args []string) error {
	var ns, deployment, leaseNS, leaseName, selector, engineLeases string
	var knative bool
	fs := flag.NewFlagSet("knative-restore", flag.ContinueOnError)
	fs.BoolVar(&knative, "knative", true, "restore Knative's config maps and activator (false: only the Lease)")
	fs.StringVar(&ns, "knative-namespace", "knative-serving", "namespace of Knative Serving")
	fs.StringVar(&deployment, "activator-deployment", "activator", "Knative's activator Deployment and container name")
	fs.StringVar(&leaseNS, "lease-namespace", "", "namespace of the operator's leader-election Lease, deleted once no operator pod is left")
	fs.StringVar(&leaseName, "lease-name", app.LeaderElectionID, "name of that Lease")
	fs.StringVar(&selector, "operator-selector", "", "label selector of the operator's pods (in --lease-namespace)")
	fs.StringVar(&engineLeases, "engine-leases", "", "comma-separated Leases of the sharded engine's buckets (in --lease-namespace), deleted with that Lease")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cs, err := hookClient()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if knative {
		if err := restoreKnative(ctx, cs, ns, deployment); err != nil {
			return err
		}
	}
	if leaseNS == "" {
		return nil
	}
	// The Lease is the operator's, not the chart's: delete it once the
	// operator's pods are gone (a terminating leader releases it with an
	// update, a standby could still create it).
	if selector != "" {
		if err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
			pods, err := cs.CoreV1().Pods(leaseNS).List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return false, err
			}
			return len(pods.Items) == 0, nil
		}); err != nil {
			return fmt.Errorf("waiting for the operator's pods (%s) to go: %w", selector, err)
		}
	}
	names := []string{leaseName}
	for _, n := range strings.Split(engineLeases, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	for _, name := range names {
		err = cs.CoordinationV1().Leases(leaseNS).Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete lease %s/%s: %w", leaseNS, name, err)
		}
	}
	fmt.Printf("knative-restore: Knative's configuration restored, leases %s/%s deleted\n", leaseNS, strings.Join(names, ","))
	return nil
}

// restoreKnative puts back what applyKnativeConfig changed.
func restoreKnative(ctx context.Context, cs kubernetes.Interface, ns, deployment string) error {
	for _, name := range []string{"config-deployment", "config-features"} {
		if err := restoreConfigMap(ctx, cs, ns, name); err != nil {
			return err
		}
	}
	return restoreActivator(ctx, cs, ns, deployment)
}

func hookClient() (kubernetes.Interface, error) {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}

func ptr(s string) *string { return &s }

// addToList adds item to a comma-separated list unless it is there.
func addToList(list, item string) string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			if s == item {
				return list
			}
			out = append(out, s)
		}
	}
	return strings.Join(append(out, item), ",")
}

// updateConfigMap sets the keys that want returns (nil deletes a key),
// saving the values they had before the first change.
func updateConfigMap(ctx context.Context, cs kubernetes.Interface, ns, name string, want func(data map[string]string) map[string]*string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("config map %s/%s: %w", ns, name, err)
		}
		saved := map[string]*string{}
		if s, ok := cm.Annotations[savedAnnotation]; ok {
			if err := json.Unmarshal([]byte(s), &saved); err != nil {
				return fmt.Errorf("config map %s/%s: annotation %s: %w", ns, name, savedAnnotation, err)
			}
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		for k, v := range want(cm.Data) {
			if _, ok := saved[k]; !ok {
				if old, ok := cm.Data[k]; ok {
					saved[k] = &old
				} else {
					saved[k] = nil
				}
			}
			if v == nil {
				delete(cm.Data, k)
			} else {
				cm.Data[k] = *v
			}
		}
		b, err := json.Marshal(saved)
		if err != nil {
			return err
		}
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[savedAnnotation] = string(b)
		_, err = cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
}

// restoreConfigMap writes back the values saved by updateConfigMap.
func restoreConfigMap(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("config map %s/%s: %w", ns, name, err)
		}
		s, ok := cm.Annotations[savedAnnotation]
		if !ok {
			return nil
		}
		saved := map[string]*string{}
		if err := json.Unmarshal([]byte(s), &saved); err != nil {
			return fmt.Errorf("config map %s/%s: annotation %s: %w", ns, name, savedAnnotation, err)
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		for k, v := range saved {
			if v == nil {
				delete(cm.Data, k)
			} else {
				cm.Data[k] = *v
			}
		}
		delete(cm.Annotations, savedAnnotation)
		if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return err
		}
		fmt.Printf("knative-restore: config map %s/%s restored\n", ns, name)
		return nil
	})
}

// savedActivator is what swapActivator keeps of Knative's activator.
type savedActivator struct {
	Container corev1.Container `json:"container"`
}

// swapActivator runs activator-ext in the activator container: Knative's
// container (as saved before the first swap) with ziptrail's image, env and
// the control stream's projected token. Knative's env, ports, probes and
// the Deployment's HPA, PDB and Service stay as they are.
func swapActivator(ctx context.Context, cs kubernetes.Interface, c knativeConfig) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := cs.AppsV1().Deployments(c.namespace).Get(ctx, c.deployment, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("deployment %s/%s: %w", c.namespace, c.deployment, err)
		}
		i := containerIndex(d, c.deployment)
		if i < 0 {
			return fmt.Errorf("deployment %s/%s has no container %q", c.namespace, c.deployment, c.deployment)
		}
		var saved savedActivator
		if s, ok := d.Annotations[savedAnnotation]; ok {
			if err := json.Unmarshal([]byte(s), &saved); err != nil {
				return fmt.Errorf("deployment %s/%s: annotation %s: %w", c.namespace, c.deployment, savedAnnotation, err)
			}
		} else {
			saved.Container = *d.Spec.Template.Spec.Containers[i].DeepCopy()
			b, err := json.Marshal(saved)
			if err != nil {
				return err
			}
			if d.Annotations == nil {
				d.Annotations = map[string]string{}
			}
			d.Annotations[savedAnnotation] = string(b)
		}
		ctr := saved.Container.DeepCopy()
		ctr.Image = c.activatorImage
		for _, e := range c.activatorEnv {
			ctr.Env = setEnv(ctr.Env, e)
		}
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{
			Name: tokenVolume, MountPath: "/var/run/secrets/tokens", ReadOnly: true})
		d.Spec.Template.Spec.Containers[i] = *ctr
		d.Spec.Template.Spec.Volumes = removeVolume(d.Spec.Template.Spec.Volumes, tokenVolume)
		expiry := int64(3600)
		d.Spec.Template.Spec.Volumes = append(d.Spec.Template.Spec.Volumes, corev1.Volume{
			Name: tokenVolume,
			VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{
				ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
					Audience: controlv1.Audience, ExpirationSeconds: &expiry, Path: controlv1.Audience},
			}}}},
		})
		_, err = cs.AppsV1().Deployments(c.namespace).Update(ctx, d, metav1.UpdateOptions{})
		return err
	})
}

// restoreActivator puts back the container saved by swapActivator.
func restoreActivator(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("deployment %s/%s: %w", ns, name, err)
		}
		s, ok := d.Annotations[savedAnnotation]
		if !ok {
			return nil
		}
		var saved savedActivator
		if err := json.Unmarshal([]byte(s), &saved); err != nil {
			return fmt.Errorf("deployment %s/%s: annotation %s: %w", ns, name, savedAnnotation, err)
		}
		if i := containerIndex(d, saved.Container.Name); i >= 0 {
			d.Spec.Template.Spec.Containers[i] = saved.Container
		}
		d.Spec.Template.Spec.Volumes = removeVolume(d.Spec.Template.Spec.Volumes, tokenVolume)
		delete(d.Annotations, savedAnnotation)
		if _, err := cs.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{}); err != nil {
			return err
		}
		fmt.Printf("knative-restore: deployment %s/%s runs %s again\n", ns, name, saved.Container.Image)
		return nil
	})
}

func containerIndex(d *appsv1.Deployment, name string) int {
	for i, c := range d.Spec.Template.Spec.Containers {
		if c.Name == name {
			return i
		}
	}
	return -1
}

func setEnv(env []corev1.EnvVar, e corev1.EnvVar) []corev1.EnvVar {
	for i := range env {
		if env[i].Name == e.Name {
			env[i] = e
			return env
		}
	}
	return append(env, e)
}

func removeVolume(vols []corev1.Volume, name string) []corev1.Volume {
	out := vols[:0:0]
	for _, v := range vols {
		if v.Name != name {
			out = append(out, v)
		}
	}
	return out
}
