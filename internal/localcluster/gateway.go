package localcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ziptrail/ziptrail/internal/tools/paths"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// adminAccount is the ServiceAccount whose token the local cluster's
// kubeconfig carries for the session gateway, which authenticates bearer
// tokens (a client certificate, the kubeconfig's other credential, does
// not reach it).
const adminAccount = "ziptrail-admin"

// gatewayCredentials sets up what the session gateway needs, as the Helm
// chart does on a cluster: the ziptrail-session-runner ClusterRole users
// bind, and a bearer token for the local admin, added to the kubeconfig.
func (c *Cluster) gatewayCredentials(ctx context.Context) (err error) {
	c.GatewayToken, err = GatewayCredentials(ctx, c.Client, c.Config, c.Kubeconfig)
	return err
}

// adminCredentials is gatewayCredentials without the session-runner
// ClusterRole, for a cluster where ziptrail is installed by its chart
// (which owns that role): the admin token, added to the kubeconfig.
func (c *Cluster) adminCredentials(ctx context.Context) (err error) {
	c.GatewayToken, err = adminToken(ctx, c.Client, c.Config, c.Kubeconfig)
	return err
}

// GatewayCredentials creates, on a fresh control plane, the
// ziptrail-session-runner ClusterRole and an admin ServiceAccount
// (kube-system/ziptrail-admin, bound to cluster-admin), and adds a token of
// it to the kubeconfig's current user, which keeps its client certificate
// for the API server: the session gateway checks bearer tokens only. It
// returns the token.
func GatewayCredentials(ctx context.Context, k8s client.Client, cfg *rest.Config, kubeconfig string) (string, error) {
	data, err := os.ReadFile(filepath.Join(paths.RepoRoot(), "charts", "ziptrail", "files", "session-runner-role.yaml"))
	if err != nil {
		return "", fmt.Errorf("the session-runner ClusterRole: %w", err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(data, role); err != nil {
		return "", fmt.Errorf("the session-runner ClusterRole: %w", err)
	}
	if err := k8s.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create ClusterRole %s: %w", role.Name, err)
	}
	return adminToken(ctx, k8s, cfg, kubeconfig)
}

// adminToken creates the admin ServiceAccount (kube-system/ziptrail-admin,
// bound to cluster-admin) and adds a token of it to the kubeconfig's
// current user; it returns the token.
func adminToken(ctx context.Context, k8s client.Client, cfg *rest.Config, kubeconfig string) (string, error) {
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: adminAccount}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: adminAccount},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: metav1.NamespaceSystem, Name: adminAccount}}},
	}
	for _, o := range objs {
		if err := k8s.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceSystem).CreateToken(ctx, adminAccount,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(365 * 24 * 3600))}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token for the session gateway: %w", err)
	}
	// The kubeconfig's user keeps its client certificate (kubectl) and
	// gains the token (the gateway; the CLI and SDKs send it).
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return "", err
	}
	kctx := kc.Contexts[kc.CurrentContext]
	if kctx == nil || kc.AuthInfos[kctx.AuthInfo] == nil {
		return "", fmt.Errorf("kubeconfig %s: no user in its current context", kubeconfig)
	}
	kc.AuthInfos[kctx.AuthInfo].Token = tr.Status.Token
	return tr.Status.Token, clientcmd.WriteToFile(*kc, kubeconfig)
}
