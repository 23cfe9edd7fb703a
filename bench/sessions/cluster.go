package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sharding"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

const (
	namespace = "bench"           // the workflows' (one tenant)
	systemNS  = "ziptrail-system" // the operator's: its Leases
)

// cluster is what every case shares: the API server (envtest), Redis,
// the functions process, the workflows and their pods' sidecars.
type cluster struct {
	tb         *servers.ProcessTB
	dir        string
	opBin      string // cmd/operator, built
	qpBin      string // cmd/queue-proxy-zl, built
	env        *envtest.Env
	kubeconfig string
	k8s        client.Client
	kube       kubernetes.Interface
	redis      *servers.Redis
	token      string // the load generator's bearer token (gateway)
	fnURL      string // the functions process
	fnPid      int
	workflows  []string
	steps      int
	sidecars   []*servers.QueueProxy
	services   map[string]string // Knative Service -> its sidecar's URL
}

// build compiles the operator and the sidecar from the working tree.
func build(tb *servers.ProcessTB, root string) (op, qp string) {
	dir := tb.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/operator", "./cmd/queue-proxy-zl")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "operator"), filepath.Join(dir, "queue-proxy-zl")
}

func startCluster(tb *servers.ProcessTB, root string, buckets, perBucket, steps int) *cluster {
	c := &cluster{tb: tb, dir: tb.TempDir(), steps: steps, services: map[string]string{}}
	c.opBin, c.qpBin = build(tb, root)
	var err error
	if c.env, err = envtest.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.env.Stop() })
	if c.kubeconfig, err = c.env.Kubeconfig(c.dir); err != nil {
		tb.Fatal(err)
	}
	if c.k8s, err = client.New(c.env.Config, client.Options{Scheme: envtest.Scheme()}); err != nil {
		tb.Fatal(err)
	}
	if c.kube, err = kubernetes.NewForConfig(c.env.Config); err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{systemNS, namespace} {
		if err := c.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			tb.Fatal(err)
		}
	}
	c.redis = servers.StartRedis(tb)
	c.token = c.runnerToken(ctx)
	c.startFunctions()
	c.pickWorkflows(buckets, perBucket)
	for _, wf := range c.workflows {
		if err := c.k8s.Create(ctx, workflow(wf, steps)); err != nil {
			tb.Fatal(err)
		}
		for i := range steps {
			c.startSidecar(ctx, wf, fnName(i))
		}
	}
	return c
}

// runnerToken is a ServiceAccount token bound to cluster-admin: the
// gateway reviews it (TokenReview, SubjectAccessReview, cached 10 s).
func (c *cluster) runnerToken(ctx context.Context) string {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "runner"}}
	if err := c.k8s.Create(ctx, sa); err != nil {
		c.tb.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bench-runner"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: namespace, Name: "runner"}}}
	if err := c.k8s.Create(ctx, crb); err != nil {
		c.tb.Fatal(err)
	}
	tr, err := c.kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "runner", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		c.tb.Fatal(err)
	}
	return tr.Status.Token
}

// pickWorkflows names perBucket workflows per engine bucket, so the
// buckets (and the load) spread evenly over the replicas.
func (c *cluster) pickWorkflows(buckets, perBucket int) {
	probe, err := sharding.New(c.kube, sharding.Config{Buckets: buckets, Identity: "probe", Namespace: systemNS})
	if err != nil {
		c.tb.Fatal(err)
	}
	count := map[string]int{}
	for i := 0; len(c.workflows) < buckets*perBucket; i++ {
		name := fmt.Sprintf("chain-%d", i)
		if b := probe.BucketOf(namespace, name); count[b] < perBucket {
			count[b]++
			c.workflows = append(c.workflows, name)
		}
	}
}

func fnName(i int) string { return fmt.Sprintf("step%d", i) }

// workflow is a chain step0 -> step1 -> ... (function-oriented form):
// each step's return value is the next one's input, the last one's is
// the session's result.
func workflow(name string, steps int) *v1alpha1.Workflow {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1alpha1.WorkflowSpec{Entry: fnName(0), SessionDeadline: &metav1.Duration{Duration: 2 * time.Minute}}}
	for i := range steps {
		wf.Spec.Functions = append(wf.Spec.Functions, v1alpha1.FunctionSpec{Name: fnName(i), Image: "example.com/bench-step"})
		if i > 0 {
			wf.Spec.Dependencies = append(wf.Spec.Dependencies, v1alpha1.Dependency{From: []string{fnName(i - 1)}, To: []string{fnName(i)}})
		}
	}
	return wf
}

// startSidecar runs the pod of function fn of workflow wf: a real
// queue-proxy-zl --standalone in front of the functions process, with its
// pod-bound token for the control stream, which it opens to replica 0
// (as through the control Service; it is redirected to the owner).
func (c *cluster) startSidecar(ctx context.Context, wf, fn string) {
	pod := wf + "-" + fn + "-pod"
	token, err := servers.BoundPodToken(ctx, c.k8s, c.kube, namespace, pod)
	if err != nil {
		c.tb.Fatal(err)
	}
	tokenFile := filepath.Join(c.dir, pod+".token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		c.tb.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "zt") // unix socket paths are short
	if err != nil {
		c.tb.Fatal(err)
	}
	c.tb.Cleanup(func() { os.RemoveAll(sockDir) })
	q, err := servers.RunQueueProxy(servers.QueueProxyOptions{Binary: c.qpBin, Upstream: c.fnURL, Stderr: io.Discard,
		Env: []string{"SERVING_NAMESPACE=" + namespace, "SERVING_POD=" + pod, "SERVING_POD_IP=127.0.0.1",
			"ZIPTRAIL_WORKFLOW=" + wf, "ZIPTRAIL_FUNCTION=" + fn, "ZIPTRAIL_METRICS_PORT=0",
			"ZIPTRAIL_OPERATOR_ADDR=" + replicaIP(0) + ":" + controlPort, "ZIPTRAIL_TOKEN_FILE=" + tokenFile,
			"ZIPTRAIL_SOCKET=" + filepath.Join(sockDir, "s.sock"), "ZIPTRAIL_SHM_DIR=" + filepath.Join(sockDir, "objects")}})
	if err != nil {
		c.tb.Fatal(err)
	}
	c.tb.Cleanup(q.Kill)
	c.sidecars = append(c.sidecars, q)
	c.services[wf+"-"+fn] = q.URL()
}

// makeReady plays Knative's part once the operator created the Services:
// each is Ready, serves traffic, and its address is its pod's sidecar
// (the dispatcher's ServiceResolver reads status.address). Idempotent.
func (c *cluster) makeReady(ctx context.Context, deadline time.Time) {
	for svcName, url := range c.services {
		for {
			svc := &servingv1.Service{}
			err := c.k8s.Get(ctx, types.NamespacedName{Namespace: namespace, Name: svcName}, svc)
			if err == nil {
				if a := svc.Status.Address; a != nil && a.URL != nil && a.URL.String() == url && svc.IsReady() {
					break
				}
				u, _ := apis.ParseURL(url)
				pct := int64(100)
				svc.Status.ObservedGeneration = svc.Generation
				svc.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionReady, Status: corev1.ConditionTrue}}
				svc.Status.URL = u
				svc.Status.Address = &duckv1.Addressable{URL: u}
				svc.Status.LatestReadyRevisionName = svcName + "-00001"
				svc.Status.LatestCreatedRevisionName = svcName + "-00001"
				svc.Status.Traffic = []servingv1.TrafficTarget{{RevisionName: svcName + "-00001", Percent: &pct}}
				if c.k8s.Status().Update(ctx, svc) == nil {
					break
				}
			}
			if time.Now().After(deadline) {
				c.tb.Fatalf("the Knative Service %s was not created by the operator (%v)", svcName, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// owners reads each workflow's owner (status.engine) once every workflow
// is Ready and owned by one of ids.
func (c *cluster) owners(ctx context.Context, ids []string, deadline time.Time) map[string]string {
	live := map[string]bool{}
	for _, id := range ids {
		live[id] = true
	}
	for {
		out := map[string]string{}
		for _, name := range c.workflows {
			wf := &v1alpha1.Workflow{}
			if c.k8s.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, wf) != nil {
				continue
			}
			ready := false
			for _, cond := range wf.Status.Conditions {
				ready = ready || cond.Type == v1alpha1.ConditionReady && cond.Status == metav1.ConditionTrue
			}
			if e := wf.Status.Engine; ready && e != nil && live[e.Owner] {
				out[name] = e.Owner
			}
		}
		if len(out) == len(c.workflows) {
			return out
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("workflows Ready with a live owner: %d of %d (%v)", len(out), len(c.workflows), out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startFunctions runs this command again as the functions process (its
// own process, so its CPU is counted apart from the load generator's).
func (c *cluster) startFunctions() {
	self, err := os.Executable()
	if err != nil {
		c.tb.Fatal(err)
	}
	cmd := exec.Command(self, "-serve-functions")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		c.tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		c.tb.Fatal(err)
	}
	c.tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		c.tb.Fatalf("functions process: %v", err)
	}
	c.fnURL, c.fnPid = strings.TrimSpace(line), cmd.Process.Pid
}

// serveFunctions is the functions process: every step of every workflow
// is the Go SDK's handler returning its input with the step's name
// appended (a few dozen bytes).
func serveFunctions() error {
	ln, err := listenLoopback()
	if err != nil {
		return err
	}
	fmt.Println("http://" + ln.Addr().String())
	h := ziptrail.FunctionHandler(func(_ context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		in := inv.Args
		for _, o := range inv.Objects {
			in = append(in, o.Bytes()...)
		}
		if len(in) > 200 {
			in = in[:200]
		}
		return append(append([]byte{}, in...), "|"+inv.Function...), nil
	})
	return (&http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
}
