package k8s

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// eventually polls f until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %s: %v", what, timeout, err)
		}
		<-tick.C
	}
}

// TestControlPlane starts the cluster without nodes and checks what each
// component does: the controller-manager's service accounts, Deployments,
// garbage collection and namespace deletion; the scheduler binding to a Node
// created by hand; kube-proxy and CoreDNS from the host; tokens with an
// audience through TokenRequest and TokenReview; and Down from the state file
// alone, as after a crash of the starting process.
func TestControlPlane(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if d := os.Getenv("LOCALK8S_TEST_STATE_DIR"); d != "" {
		dir = d // keep the logs
	}
	opts := Options{
		StateDir: dir, NetPrefix: "ztkt", Log: testWriter{t},
		ClusterCIDR: netip.MustParsePrefix("10.222.0.0/16"), ServiceCIDR: netip.MustParsePrefix("10.98.0.0/16"),
		// e2e/node may hold the host's one cluster.
		WaitForHost: 45 * time.Minute, // the e2e suites, each with its own cluster, take turns
	}
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop(context.Background())
		}
	})
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("second cluster on the host is refused", func(t *testing.T) {
		o := opts
		o.StateDir, o.WaitForHost = t.TempDir(), 0
		_, err := Start(ctx, o)
		if err == nil || !strings.Contains(err.Error(), "already running") {
			t.Fatalf("second Start: got %v, want an 'already running' error", err)
		}
		// The same state directory again (`local up` twice) must not take
		// the running cluster down either; the specs below use it.
		o.StateDir = dir
		if _, err := Start(ctx, o); err == nil || !strings.Contains(err.Error(), "already running") {
			t.Fatalf("Start with the running cluster's state dir: got %v, want an 'already running' error", err)
		}
	})

	ns := "lk8s"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := WaitDefaultServiceAccount(ctx, cs, ns); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "kube-root-ca.crt published", func() error {
		_, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})

	t.Run("deployment to scheduled pods", func(t *testing.T) { testDeploymentScheduled(t, ctx, cs, ns) })
	t.Run("DNS and ClusterIP from the host", func(t *testing.T) { testHostServices(t, ctx, c) })
	t.Run("token with audience", func(t *testing.T) { testTokenReview(t, ctx, cs, ns) })

	t.Run("namespace deletion", func(t *testing.T) {
		if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "namespace finalized", func() error {
			_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("namespace still there (%v)", err)
		})
	})

	t.Run("down from the state file", func(t *testing.T) {
		st, err := ReadState(dir)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := Down(ctx, dir); !ok || err != nil {
			t.Fatalf("Down: %v %v", ok, err)
		}
		stopped = true
		for _, comp := range st.Components {
			if comp.alive() {
				t.Errorf("%s (pid %d) still runs after Down", comp.Name, comp.PID)
			}
		}
		if out, err := exec.Command("iptables", "-t", "nat", "-S", "KUBE-SERVICES").CombinedOutput(); err == nil {
			t.Errorf("kube-proxy's KUBE-SERVICES chain is left after Down:\n%s", out)
		}
		if _, err := net.InterfaceByName(hostIface(opts.NetPrefix)); err == nil {
			t.Errorf("host interface %s is left after Down", hostIface(opts.NetPrefix))
		}
		if _, err := os.Stat(ownerFile); err == nil {
			t.Errorf("%s is left after Down", ownerFile)
		}
	})
}

func testDeploymentScheduled(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns string) {
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "example.invalid/web:1"}}},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods *corev1.PodList
	eventually(t, 30*time.Second, "deployment's pods created", func() error {
		var err error
		pods, err = cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		if len(pods.Items) != 2 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		return nil
	})
	// The ServiceAccount admission plugin mounted the API token.
	if vs := pods.Items[0].Spec.Volumes; len(vs) == 0 || vs[0].Projected == nil {
		t.Errorf("pod has no projected service-account token volume: %+v", vs)
	}
	// No node yet: Pending and unscheduled.
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s bound to %s without any node", p.Name, p.Spec.NodeName)
		}
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "hand-made", Labels: map[string]string{"kubernetes.io/hostname": "hand-made"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
	// The node lifecycle controller updates new nodes too: retry on conflict.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := cs.CoreV1().Nodes().Get(ctx, "hand-made", metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status = corev1.NodeStatus{
			Capacity: capacity, Allocatable: capacity,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "pods bound to the hand-made node", func() error {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName != "hand-made" {
				return fmt.Errorf("pod %s on %q", p.Name, p.Spec.NodeName)
			}
		}
		return nil
	})
	// Garbage collection: the Deployment's ReplicaSet goes with it.
	if err := cs.AppsV1().Deployments(ns).Delete(ctx, "web", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "ReplicaSet garbage-collected", func() error {
		rs, err := cs.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		if len(rs.Items) > 0 {
			return fmt.Errorf("%d ReplicaSets left", len(rs.Items))
		}
		return nil
	})
	// Without a kubelet, nothing confirms the pods' termination: remove the
	// node and delete them at once, as a user would after losing a node.
	if err := cs.CoreV1().Nodes().Delete(ctx, "hand-made", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))},
		metav1.ListOptions{LabelSelector: "app=web"}); err != nil {
		t.Fatal(err)
	}
}

func testHostServices(t *testing.T, ctx context.Context, c *Cluster) {
	// CoreDNS behind the kube-dns ClusterIP, through kube-proxy's rules.
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(c.State.DNSIP, "53"))
	}}
	svcIP := nthAddr(c.opts.ServiceCIDR, 1).String()
	eventually(t, 30*time.Second, "kubernetes.default resolves through "+c.State.DNSIP, func() error {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		addrs, err := r.LookupHost(lctx, "kubernetes.default.svc.cluster.local")
		if err != nil {
			return err
		}
		if len(addrs) != 1 || addrs[0] != svcIP {
			return fmt.Errorf("kubernetes.default.svc.cluster.local = %v, want %s", addrs, svcIP)
		}
		return nil
	})
	if _, err := r.LookupHost(ctx, "no-such-service.default.svc.cluster.local"); err == nil {
		t.Error("an unknown service name resolved")
	}
	// The API server through its ClusterIP, verified as in-cluster clients
	// verify it (the serving certificate names the ClusterIP).
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.caPEM())
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	eventually(t, 30*time.Second, "API server through its ClusterIP", func() error {
		resp, err := hc.Get("https://" + net.JoinHostPort(svcIP, "443") + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
}

func testTokenReview(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns string) {
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "default", &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{"ziptrail.dev/test"}, ExpirationSeconds: ptr.To(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	review := func(aud string) *authnv1.TokenReview {
		t.Helper()
		r, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
			Spec: authnv1.TokenReviewSpec{Token: tr.Status.Token, Audiences: []string{aud}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ok := review("ziptrail.dev/test")
	if !ok.Status.Authenticated || ok.Status.User.Username != "system:serviceaccount:"+ns+":default" {
		t.Errorf("token with its audience: %+v", ok.Status)
	}
	if bad := review("someone-else"); bad.Status.Authenticated {
		t.Errorf("token accepted for another audience: %+v", bad.Status)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
