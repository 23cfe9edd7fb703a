// Package chartops reads and drives ziptrail installed with its Helm chart
// on a cluster, as an operator of the cluster would: the helm and kubectl
// CLIs, the operator's pods, its leader and the owners of the sharded
// engine's buckets (their Leases), the session gateway's Service and a
// session runner's token. The chaos checker (bench/chaos) and the Helm e2e
// suite (e2e/helm) share it.
package chartops

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ziptrail/ziptrail/internal/tools/paths"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// LeaderLease is the unsharded operator's leader election Lease (its
// holder is "<pod name>_<uuid>"); EngineLeasePrefix starts the sharded
// engine's bucket Leases (holder: the owner's pod IP).
const (
	LeaderLease       = "operator.ziptrail.dev"
	EngineLeasePrefix = "ziptrail-engine."
	// SessionRunnerRole is the chart's ClusterRole for running sessions.
	SessionRunnerRole = "ziptrail-session-runner"
)

// Release is an installed (or to be installed) release of charts/ziptrail.
type Release struct {
	Name, Namespace string
	Chart           string // default <repo>/charts/ziptrail
	Kubeconfig      string
	Clientset       kubernetes.Interface
	// HelmHome keeps helm's configuration and cache (HELM_*_HOME) apart
	// from the user's; default a directory under the system's temp dir.
	HelmHome string
	Log      io.Writer // the commands run and helm's output; default io.Discard
}

func (r *Release) log() io.Writer {
	if r.Log == nil {
		return io.Discard
	}
	return r.Log
}

// Helm runs the helm CLI (PATH or $ZIPTRAIL_CACHE/bin) against the
// cluster; it returns its output.
func (r *Release) Helm(ctx context.Context, args ...string) (string, error) {
	bin := paths.FindBinary("helm")
	if bin == "" {
		return "", fmt.Errorf("helm not found on PATH or in $ZIPTRAIL_CACHE/bin: run hack/install-deps.sh")
	}
	home := r.HelmHome
	if home == "" {
		home = filepath.Join(os.TempDir(), "ziptrail-helm")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+r.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	fmt.Fprintf(r.log(), "$ helm %s\n", strings.Join(args, " "))
	err := cmd.Run()
	fmt.Fprintf(r.log(), "%s", out.String())
	if err != nil {
		return out.String(), fmt.Errorf("helm %s: %w: %s", args[0], err, out.String())
	}
	return out.String(), nil
}

// Kubectl runs kubectl ($KUBEBUILDER_ASSETS, else PATH) against the
// cluster; it returns its output.
func (r *Release) Kubectl(ctx context.Context, args ...string) (string, error) {
	bin := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	if _, err := os.Stat(bin); err != nil {
		bin = "kubectl"
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", r.Kubeconfig}, args...)...)
	fmt.Fprintf(r.log(), "$ kubectl %s\n", strings.Join(args, " "))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Install runs `helm install` of the chart with values (--set), waiting
// for the rollout.
func (r *Release) Install(ctx context.Context, values ...string) error {
	chart := r.Chart
	if chart == "" {
		chart = filepath.Join(paths.RepoRoot(), "charts", "ziptrail")
	}
	args := []string{"install", r.Name, chart, "-n", r.Namespace, "--create-namespace", "--wait", "--timeout", "10m"}
	for _, v := range values {
		args = append(args, "--set", v)
	}
	_, err := r.Helm(ctx, args...)
	return err
}

// Upgrade runs `helm upgrade --reuse-values` with values (--set), waiting
// for the rollout.
func (r *Release) Upgrade(ctx context.Context, values ...string) error {
	chart := r.Chart
	if chart == "" {
		chart = filepath.Join(paths.RepoRoot(), "charts", "ziptrail")
	}
	args := []string{"upgrade", r.Name, chart, "-n", r.Namespace, "--reuse-values", "--wait", "--timeout", "10m"}
	for _, v := range values {
		args = append(args, "--set", v)
	}
	_, err := r.Helm(ctx, args...)
	return err
}

// Uninstall runs `helm uninstall`, waiting for the release's objects to go.
func (r *Release) Uninstall(ctx context.Context) error {
	_, err := r.Helm(ctx, "uninstall", r.Name, "-n", r.Namespace, "--wait", "--timeout", "10m")
	return err
}

// Deployment is the operator's Deployment name.
func (r *Release) Deployment() string { return r.Name + "-operator" }

// RolloutRestart runs `kubectl rollout restart` of the operator's
// Deployment and waits (`kubectl rollout status`) until it finished.
func (r *Release) RolloutRestart(ctx context.Context) error {
	if _, err := r.Kubectl(ctx, "-n", r.Namespace, "rollout", "restart", "deploy/"+r.Deployment()); err != nil {
		return err
	}
	_, err := r.Kubectl(ctx, "-n", r.Namespace, "rollout", "status", "deploy/"+r.Deployment(), "--timeout", "5m")
	return err
}

// OperatorSelector selects the release's operator pods.
func (r *Release) OperatorSelector() string {
	return "app.kubernetes.io/instance=" + r.Name + ",app.kubernetes.io/component=operator"
}

// OperatorPods lists the operator's pods that are not being deleted.
func (r *Release) OperatorPods(ctx context.Context) ([]corev1.Pod, error) {
	list, err := r.Clientset.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: r.OperatorSelector()})
	if err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			pods = append(pods, p)
		}
	}
	return pods, nil
}

// Leader is the pod that holds the (unsharded) operator's leader Lease.
func (r *Release) Leader(ctx context.Context) (*corev1.Pod, error) {
	lease, err := r.Clientset.CoordinationV1().Leases(r.Namespace).Get(ctx, LeaderLease, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return nil, fmt.Errorf("the Lease %s has no holder", LeaderLease)
	}
	holder, _, _ := strings.Cut(*lease.Spec.HolderIdentity, "_") // <pod name>_<uuid>
	p, err := r.Clientset.CoreV1().Pods(r.Namespace).Get(ctx, holder, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the leader's pod %s: %w", holder, err)
	}
	return p, nil
}

// BucketOwners maps each bucket Lease of the sharded engine to its
// holder's pod IP; a Lease not renewed within stale has no holder ("").
func (r *Release) BucketOwners(ctx context.Context, stale time.Duration) (map[string]string, error) {
	list, err := r.Clientset.CoordinationV1().Leases(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	owners := map[string]string{}
	for _, l := range list.Items {
		if !strings.HasPrefix(l.Name, EngineLeasePrefix) || !strings.Contains(l.Name, "-of-") {
			continue
		}
		h := ""
		if l.Spec.HolderIdentity != nil && l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < stale {
			h = *l.Spec.HolderIdentity
		}
		owners[l.Name] = h
	}
	return owners, nil
}

// PodByIP is the operator pod with that IP.
func (r *Release) PodByIP(ctx context.Context, ip string) (*corev1.Pod, error) {
	pods, err := r.OperatorPods(ctx)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Status.PodIP == ip {
			return &pods[i], nil
		}
	}
	return nil, fmt.Errorf("no operator pod has IP %s", ip)
}

// Gateway is the chart's session gateway Service (its ClusterIP, which the
// host reaches through kube-proxy): the HTTP base URL and the gRPC
// host:port.
func (r *Release) Gateway(ctx context.Context) (httpURL, grpcAddr string, err error) {
	svc, err := r.Clientset.CoreV1().Services(r.Namespace).Get(ctx, r.Name+"-gateway", metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	for _, p := range svc.Spec.Ports {
		switch p.Name {
		case "http-gateway":
			httpURL = fmt.Sprintf("http://%s:%d", svc.Spec.ClusterIP, p.Port)
		case "grpc-gateway":
			grpcAddr = fmt.Sprintf("%s:%d", svc.Spec.ClusterIP, p.Port)
		}
	}
	if httpURL == "" || grpcAddr == "" {
		return httpURL, grpcAddr, fmt.Errorf("the Service %s-gateway lacks its http-gateway or grpc-gateway port", r.Name)
	}
	return httpURL, grpcAddr, nil
}

// RunnerToken is a token of ServiceAccount namespace/name, bound (created
// if missing) to the chart's session runner ClusterRole in every namespace,
// as a user's client would hold.
func RunnerToken(ctx context.Context, cs kubernetes.Interface, namespace, name string, ttl time.Duration) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: namespace + "-" + name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: SessionRunnerRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	secs := int64(ttl.Seconds())
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// PodReady reports a pod's Ready condition.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
