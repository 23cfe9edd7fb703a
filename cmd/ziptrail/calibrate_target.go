package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// Where calibrate writes: a ConfigMap of the cluster (--write-configmap).

// configMapTarget is where --configmap writes: a namespace and name on the
// cluster of a kubeconfig.
type configMapTarget struct {
	namespace, name, context string
	client                   kubernetes.Interface
}

// newConfigMapTarget resolves NAMESPACE/NAME and the kubeconfig (explicit
// path, else $KUBECONFIG, else ~/.kube/config) and checks that the
// ConfigMap can be read (it may not exist yet).
func newConfigMapTarget(ctx context.Context, kubeconfig, spec string) (*configMapTarget, error) {
	ns, name, _ := strings.Cut(spec, "/")
	if name == "" {
		name = model.ConfigMapName
	}
	if ns == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("--configmap %q: want NAMESPACE/NAME or NAMESPACE", spec)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	raw, err := cc.RawConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig for --configmap: %w", err)
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig for --configmap (pass --kubeconfig): %w", err)
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	t := &configMapTarget{namespace: ns, name: name, context: raw.CurrentContext, client: kc}
	if t.context == "" {
		t.context = rc.Host
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := kc.CoreV1().ConfigMaps(ns).Get(cctx, name, metav1.GetOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("ConfigMap %s/%s on %q: %w", ns, name, t.context, err)
	}
	return t, nil
}

// write creates the ConfigMap or replaces its calibration; it returns
// "created" or "updated".
func (t *configMapTarget) write(ctx context.Context, cal model.Calibration) (string, error) {
	data, err := cal.ConfigMapData()
	if err != nil {
		return "", err
	}
	labels := map[string]string{"app.kubernetes.io/part-of": "ziptrail", "app.kubernetes.io/component": "shuffle-calibration"}
	cms := t.client.CoreV1().ConfigMaps(t.namespace)
	cur, err := cms.Get(ctx, t.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: t.namespace, Name: t.name, Labels: labels}, Data: data}, metav1.CreateOptions{})
		if err != nil {
			return "", fmt.Errorf("create ConfigMap %s/%s: %w", t.namespace, t.name, err)
		}
		return "created", nil
	}
	if err != nil {
		return "", err
	}
	if cur.Data == nil {
		cur.Data = map[string]string{}
	}
	for k, v := range data {
		cur.Data[k] = v
	}
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	for k, v := range labels {
		cur.Labels[k] = v
	}
	if _, err := cms.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return "", fmt.Errorf("update ConfigMap %s/%s: %w", t.namespace, t.name, err)
	}
	return "updated", nil
}
