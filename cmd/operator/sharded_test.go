package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestShardedReplicasSIGKILL runs two operator processes (this command,
// built) with --engine-buckets=4 on one API server (envtest) and one
// redis-server, as two pods of the chart's Deployment would be: each
// known by its own address (127.0.0.2 and 127.0.0.3, the same ports).
// They spread the buckets (ziptrail_engine_buckets_owned 2 each); a
// Workflow's status.engine names its bucket's owner; the owner is
// SIGKILLed, and the survivor takes every bucket once the Leases expire
// and becomes the workflow's owner in its status.
func TestShardedReplicasSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the operator")
	}
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	dir := t.TempDir()
	kubeconfig, err := env.Kubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	k8s, err := client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{"ziptrail-system", "team-a"} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	redis := servers.StartRedis(t)
	bin := filepath.Join(dir, "operator")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the operator: %v\n%s", err, out)
	}

	ips := []string{"127.0.0.2", "127.0.0.3"}
	port := func() string { // free on the replicas' addresses
		ln, err := net.Listen("tcp", ips[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	}
	metrics, probes, ctl, gw, gwg, inputs := port(), port(), port(), port(), port(), port()
	procs := map[string]*exec.Cmd{}
	for _, ip := range ips {
		cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--engine-buckets=4", "--engine-identity="+ip,
			"--engine-lease-duration=4s", "--engine-renew-deadline=3s", "--engine-retry-period=500ms",
			"--leader-elect=true", "--leader-election-namespace=ziptrail-system",
			"--metrics-bind-address="+ip+":"+metrics, "--health-probe-bind-address="+ip+":"+probes,
			"--control-bind-address="+ip+":"+ctl, "--gateway-bind-address="+ip+":"+gw, "--gateway-grpc-bind-address="+ip+":"+gwg,
			"--inputs-bind-address="+ip+":"+inputs, "--inputs-advertise-address="+ip+":"+inputs, "--redis-addr="+redis.Addr)
		cmd.Env = append(os.Environ(), "POD_NAMESPACE=ziptrail-system")
		log, err := os.Create(filepath.Join(dir, ip+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[ip] = cmd
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			if t.Failed() {
				b, _ := os.ReadFile(log.Name())
				t.Logf("--- %s:\n%s", ip, tail(string(b), 30))
			}
		})
	}
	owned := func(ip string) string {
		resp, err := http.Get("http://" + ip + ":" + metrics + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "ziptrail_engine_buckets_owned "); ok {
				return v
			}
		}
		return ""
	}
	waitUntil(t, "the buckets to spread, 2 each", func() bool { return owned(ips[0]) == "2" && owned(ips[1]) == "2" })

	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "chain"},
		Spec: v1alpha1.WorkflowSpec{Entry: "run", Functions: []v1alpha1.FunctionSpec{{Name: "run", Image: "example.com/run"}}}}
	if err := k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	engine := func() *v1alpha1.WorkflowEngine {
		got := &v1alpha1.Workflow{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "chain"}, got); err != nil {
			return nil
		}
		return got.Status.Engine
	}
	var owner string
	waitUntil(t, "status.engine to name the workflow's owner", func() bool {
		if e := engine(); e != nil {
			owner = e.Owner
		}
		return owner != ""
	})
	survivor := ips[0]
	if owner == ips[0] {
		survivor = ips[1]
	}
	if err := procs[owner].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitUntil(t, "the survivor to own every bucket", func() bool { return owned(survivor) == "4" })
	t.Logf("the survivor owned all 4 buckets %v after the SIGKILL (Lease duration 4s)", time.Since(killed).Round(100*time.Millisecond))
	waitUntil(t, "status.engine to name the survivor", func() bool { e := engine(); return e != nil && e.Owner == survivor })
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
