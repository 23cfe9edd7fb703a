package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// cliEnv is a real API server, the operator's orchestrator with a workflow
// "upper" (one function returning its input upper-cased, 5 times), and the real gateway,
// recorded in a state dir as `ziptrail local up` does; kubeconfigs of a
// ServiceAccount with the session-runner role and of one without.
type cliEnv struct {
	state, url           string
	allowed, denied, tok string
	certKubeconfig       string
	fns                  *servers.Functions
	orch                 *orchestrator.Orchestrator
	keys                 *control.SecretKeys
	gateway              http.Handler // the gateway srv serves at url
}

func startGateway(t *testing.T) cliEnv {
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	k8s, err := client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(paths.RepoRoot(), "charts", "ziptrail", "files", "session-runner-role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(data, role); err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{role, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "dev"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "guest"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "dev-sessions"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "team-a", Name: "dev"}}}}
	for _, o := range objs {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	kubeconfig := func(sa string) (string, string) {
		tr, err := cs.CoreV1().ServiceAccounts("team-a").CreateToken(ctx, sa, &authv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		kc := clientcmdapi.NewConfig()
		kc.Clusters["local"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
		kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
		kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: sa}
		kc.CurrentContext = "local"
		path := filepath.Join(dir, sa+".kubeconfig")
		if err := clientcmd.WriteToFile(*kc, path); err != nil {
			t.Fatal(err)
		}
		return path, tr.Status.Token
	}
	var e cliEnv
	e.allowed, e.tok = kubeconfig("dev")
	e.denied, _ = kubeconfig("guest")
	if e.certKubeconfig, err = env.Kubeconfig(dir); err != nil {
		t.Fatal(err)
	}

	fns := &servers.Functions{}
	fns.Add(t, "upper-run", ziptrail.FunctionHandler(func(_ context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		return bytes.Repeat(bytes.ToUpper(inv.Objects[0].Bytes()), 5), nil
	}))
	e.fns, e.keys = fns, &control.SecretKeys{Client: k8s}
	orch, err := orchestrator.New(orchestrator.Options{Resolver: fns, Log: logr.Discard(), Keys: e.keys})
	if err != nil {
		t.Fatal(err)
	}
	octx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- orch.Run(octx) }()
	t.Cleanup(func() { stop(); <-done })
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "upper"},
		Spec: v1alpha1.WorkflowSpec{Entry: "run", Functions: []v1alpha1.FunctionSpec{{Name: "run", Image: "example.com/run"}}}}
	if err := orch.SetWorkflow(wf, true, ""); err != nil {
		t.Fatal(err)
	}
	e.orch = orch
	e.gateway = gateway.New(&gateway.Handler{Starter: orch, Sessions: orch.Sessions(), Results: orch.Results(), Auth: &gateway.KubeAuth{Client: k8s}})
	srv := httptest.NewServer(e.gateway)
	t.Cleanup(srv.Close)
	e.state, e.url = t.TempDir(), srv.URL
	state, _ := json.Marshal(localcluster.State{GatewayURL: srv.URL, Kubeconfig: e.allowed})
	if err := os.WriteFile(localcluster.StateFile(e.state), state, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", "") // the tests choose
	return e
}

func TestRunAndSessions(t *testing.T) {
	e := startGateway(t)
	ctx := context.Background()
	// A 60 kB input and a 300 kB result: they stream both ways.
	in := filepath.Join(t.TempDir(), "in.txt")
	text := strings.Repeat("hello ziptrail ", 4_000)
	if err := os.WriteFile(in, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}

	// The running local cluster's kubeconfig.
	var out, progress bytes.Buffer
	if err := runRun(ctx, []string{"upper", "--input", in, "-n", "team-a", "--state-dir", e.state}, nil, &out, &progress); err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	// Into a pipe or a file the result's bytes exactly: no newline added.
	if out.String() != strings.Repeat(strings.ToUpper(text), 5) {
		t.Errorf("result: %d bytes, want %d", out.Len(), 5*len(text))
	}
	for _, want := range []string{"==> session upper-", " of team-a/upper started (60000 bytes of input)", "Invoked      run with 1 objects",
		"Completed", "==> Completed in ", "1 invocations, 1 objects; result 300000 bytes"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}

	// stdin, flags before the workflow, quiet; a bearer token instead.
	out.Reset()
	progress.Reset()
	if err := runRun(ctx, []string{"-q", "--gateway", e.url, "--token", e.tok, "-n", "team-a", "--input", "-", "upper"}, strings.NewReader("again"), &out, &progress); err != nil {
		t.Fatal(err)
	}
	if out.String() != "AGAINAGAINAGAINAGAINAGAIN" || progress.Len() != 0 {
		t.Errorf("quiet run: result %q, progress %q", out.String(), progress.String())
	}

	// -o: the result into a file, whole; nothing on stdout.
	out.Reset()
	progress.Reset()
	file := filepath.Join(t.TempDir(), "result.bin")
	if err := runRun(ctx, []string{"upper", "-o", file, "--gateway", e.url, "--token", e.tok, "-n", "team-a", "--input", "-"}, strings.NewReader("bytes"), &out, &progress); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(file); err != nil || string(got) != "BYTESBYTESBYTESBYTESBYTES" || out.Len() != 0 {
		t.Errorf("-o: file %q (%v), stdout %q", got, err, out.String())
	}
	if !strings.Contains(progress.String(), "==> result written to "+file) {
		t.Errorf("-o: progress %q", progress.String())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(file), ".result.bin.*")); len(left) != 0 {
		t.Errorf("-o left %v behind", left)
	}
	// A failed session leaves no file; a directory that does not exist
	// is refused before anything starts.
	missing := filepath.Join(t.TempDir(), "nope.bin")
	if err := runRun(ctx, []string{"nope", "-o", missing, "--gateway", e.url, "--token", e.tok, "-n", "team-a"}, nil, &out, &progress); err == nil {
		t.Error("-o of an unknown workflow succeeded")
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("-o of a failed run left %s: %v", missing, err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(missing), ".nope.bin.*")); len(left) != 0 {
		t.Errorf("a failed -o left %v behind", left)
	}
	err := runRun(ctx, []string{"upper", "-o", filepath.Join(t.TempDir(), "no", "such", "dir", "r"), "--gateway", e.url, "--token", e.tok, "-n", "team-a"}, nil, &out, &progress)
	if err == nil || !strings.Contains(err.Error(), "result file:") {
		t.Errorf("-o into a missing directory: %v", err)
	}

	err = runRun(ctx, []string{"nope", "-n", "team-a", "--state-dir", e.state}, nil, &out, &progress)
	if err == nil || !strings.Contains(err.Error(), "workflow not found: team-a/nope") {
		t.Errorf("unknown workflow: %v", err)
	}

	// Without the role, or without a token: refused with the reason.
	err = runRun(ctx, []string{"upper", "-n", "team-a", "--state-dir", e.state, "--kubeconfig", e.denied}, nil, &out, &progress)
	if err == nil || !strings.Contains(err.Error(), `"system:serviceaccount:team-a:guest" may not create`) || !strings.Contains(err.Error(), "ziptrail-session-runner") {
		t.Errorf("ServiceAccount without the role: %v", err)
	}
	err = runRun(ctx, []string{"upper", "-n", "team-a", "--gateway", e.url, "--kubeconfig", e.certKubeconfig}, nil, &out, &progress)
	if err == nil || !strings.Contains(err.Error(), "no bearer token") || !strings.Contains(err.Error(), "kubectl create token") {
		t.Errorf("client-certificate kubeconfig: %v", err)
	}

	out.Reset()
	if err := runSessions(ctx, []string{"-n", "team-a", "--state-dir", e.state}, &out, &progress); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// The three runs above (the last with -o).
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "SESSION") || !strings.HasPrefix(lines[1], "upper-") || !strings.HasPrefix(lines[3], "upper-") {
		t.Fatalf("sessions table, newest first:\n%s", out.String())
	}
	if f := strings.Fields(lines[3]); f[1] != "upper" || f[2] != "Completed" || f[3] != "1" || f[4] != "1" {
		t.Errorf("row %q", lines[3])
	}

	out.Reset()
	if err := runSessions(ctx, []string{"other", "-n", "team-a", "--state-dir", e.state}, &out, &progress); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no sessions") {
		t.Errorf("filtered by workflow: %q", out.String())
	}
	if err := runSessions(ctx, []string{"-n", "team-a", "--state-dir", e.state, "--kubeconfig", e.denied}, &out, &progress); err == nil || !strings.Contains(err.Error(), "may not list") {
		t.Errorf("listing without the role: %v", err)
	}
}

func TestRunWithoutCluster(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none")) // no cluster either
	err := runRun(context.Background(), []string{"upper", "--state-dir", t.TempDir()}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ziptrail local up") || !strings.Contains(err.Error(), "--gateway") {
		t.Errorf("want a hint to start the local cluster or pass --gateway, got %v", err)
	}
}

// TestRunFindsAHelmInstalledGateway: without a local cluster or
// --gateway, the CLI finds the chart's gateway Service on the cluster of
// the kubeconfig and says how to reach it.
func TestRunFindsAHelmInstalledGateway(t *testing.T) {
	e := startGateway(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", e.certKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	k8s, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ziptrail-system"}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "zt-gateway", Labels: map[string]string{"app.kubernetes.io/name": "ziptrail"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http-gateway", Port: 8088}}}}
	for _, o := range []client.Object{ns, svc} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	err = runRun(ctx, []string{"upper", "--state-dir", t.TempDir(), "--kubeconfig", e.certKubeconfig}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ziptrail-system/zt-gateway") || !strings.Contains(err.Error(), "port-forward service/zt-gateway 8088:8088") {
		t.Errorf("want the chart's gateway named with how to reach it, got %v", err)
	}

	// `local up --no-operator` (a state without a gateway), then the
	// chart: its kubeconfig is the one asked.
	state := t.TempDir()
	js, _ := json.Marshal(localcluster.State{Kubeconfig: e.certKubeconfig})
	if err := os.WriteFile(localcluster.StateFile(state), js, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", "")
	err = runRun(ctx, []string{"upper", "--state-dir", state}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ziptrail-system/zt-gateway") {
		t.Errorf("local up --no-operator, then the chart: want its gateway named, got %v", err)
	}

	// Reached on its cluster IP (here: the test's gateway stands in for
	// it), the chart's gateway runs the session on the local cluster's
	// own kubeconfig; found through any other, it is named with its
	// address for the user to pass (credentials go only where told).
	before := clusterURL
	clusterURL = func(*corev1.Service) string { return e.url }
	t.Cleanup(func() { clusterURL = before })
	var out bytes.Buffer
	if err := runRun(ctx, []string{"upper", "-n", "team-a", "-q", "--token", e.tok, "--state-dir", state, "--input", "-"},
		strings.NewReader("hi"), &out, io.Discard); err != nil || out.String() != "HIHIHIHIHI" {
		t.Errorf("through the discovered gateway: %q, %v", out.String(), err)
	}
	err = runRun(ctx, []string{"upper", "-n", "team-a", "--state-dir", t.TempDir(), "--kubeconfig", e.certKubeconfig}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "pass --gateway "+e.url) {
		t.Errorf("a gateway found through another kubeconfig: want its address named, got %v", err)
	}
	clusterURL = before

	if err := k8s.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	err = runRun(ctx, []string{"upper", "--state-dir", state}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "without the operator") {
		t.Errorf("local up --no-operator without the chart: want it said, got %v", err)
	}
}

// TestRunStreams1GiBResult: `ziptrail run` writes a 1 GiB result, held by
// reference in its producer's data plane, to stdout as it arrives: neither
// the gateway nor the CLI (both in this process) holds it.
func TestRunStreams1GiBResult(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 1 GiB")
	}
	const size = 1 << 30
	e := startGateway(t)
	ctx := context.Background()
	// The producer: a data-plane server holding the result, sealed with
	// team-a's keys as its sidecar would; the function returns the reference.
	keys, err := e.keys.Keys(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string][]byte{}
	for _, k := range keys.Keys {
		secrets[k.Id] = k.Secret
	}
	kr, err := ref.NewKeyring("team-a", secrets, keys.ActiveKeyId)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	// Into a pipe or a file, the result's bytes exactly.
	wh := sha256.New()
	wh.Write(data)
	want := wh.Sum(nil)
	st := store.New(size+1, nil)
	if err := st.Put(ctx, store.Meta{ID: "huge", Bucket: "output", Key: "result", Reads: math.MaxUint32, Expires: time.Now().Add(time.Hour)}, data); err != nil {
		t.Fatal(err)
	}
	data = nil
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &pull.Server{Store: st, Keys: kr}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	rf, err := kr.Seal(ref.Record{Addr: ln.Addr().String(), Key: "huge", Expires: time.Now().Add(time.Hour), Reads: math.MaxUint32})
	if err != nil {
		t.Fatal(err)
	}
	e.fns.Add(t, "huge-run", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		_ = json.NewEncoder(w).Encode(invocation.Outputs{Objects: []invocation.Object{{Bucket: "output", Key: "result", Size: size, Ref: rf}}})
	}))
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "huge"},
		Spec: v1alpha1.WorkflowSpec{Entry: "run", Functions: []v1alpha1.FunctionSpec{{Name: "run", Image: "example.com/run"}}}}
	if err := e.orch.SetWorkflow(wf, true, ""); err != nil {
		t.Fatal(err)
	}

	// The collector runs at 5% heap growth, so the heap in use is what is
	// retained (the 1 GiB store would otherwise let a GiB of garbage pile up).
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	base, peak := m.HeapInuse, m.HeapInuse
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
		}
	}()
	h := sha256.New()
	var progress bytes.Buffer
	err = runRun(ctx, []string{"huge", "-n", "team-a", "--state-dir", e.state}, nil, h, &progress)
	close(stop)
	<-sampled
	if err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) || !strings.Contains(progress.String(), "result 1073741824 bytes") {
		t.Errorf("result digest or size wrong:\n%s", progress.String())
	}
	grew := int64(peak) - int64(base)
	t.Logf("heap in use grew by at most %.1f MiB while the CLI received 1 GiB", float64(grew)/(1<<20))
	if grew > 256<<20 {
		t.Errorf("the heap grew by %d MiB while the CLI received a 1 GiB result: it is being buffered", grew>>20)
	}
}
