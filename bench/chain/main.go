// Command chain measures workflow latency on the local cluster: sessions of
// function-oriented chains of 2, 4 and 100 trivial Python functions (each
// returns its input), end to end through the gateway, the trigger engine,
// the dispatcher, the ingress and every pod's queue-proxy-zl. With trivial
// functions the time is the orchestration overhead.
//
//	go run ./bench/chain [-lengths 2,4,100] [-sessions 20]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/controlplane"
	"github.com/ziptrail/ziptrail/internal/localcluster"
)

const handler = "import ziptrail\ndef handle(inv):\n    return inv.objects[0].bytes()\nziptrail.serve(handle)\n"

func main() {
	lengths := flag.String("lengths", "2,4,100", "chain lengths")
	n := flag.Int("sessions", 20, "sessions per chain (the first is a warm-up)")
	flag.Parse()
	if err := run(*lengths, *n); err != nil {
		fmt.Fprintln(os.Stderr, "chain:", err)
		os.Exit(1)
	}
}

func run(lengths string, sessions int) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "ziptrail-chain-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	root := controlplane.RepoRoot()
	qp := filepath.Join(dir, "queue-proxy-zl")
	build := exec.Command("go", "build", "-o", qp, "./cmd/queue-proxy-zl")
	build.Dir, build.Stderr = root, os.Stderr
	if err := build.Run(); err != nil {
		return err
	}
	c, err := localcluster.Up(ctx, localcluster.Options{StateDir: dir, QueueProxy: qp, Instances: 1, NetPrefix: "ztc",
		Subnet: netip.MustParsePrefix("10.218.0.0/23"), Log: os.Stderr})
	if err != nil {
		return err
	}
	defer c.Down(context.Background())
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}); err != nil {
		return err
	}
	fmt.Println("| chain | sessions | p50 | p95 | per hop (p50) |\n|---|---|---|---|---|")
	for _, ls := range strings.Split(lengths, ",") {
		length, err := strconv.Atoi(ls)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("chain%d", length)
		wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench"}, Spec: v1alpha1.WorkflowSpec{Entry: "f0"}}
		for i := 0; i < length; i++ {
			wf.Spec.Functions = append(wf.Spec.Functions, v1alpha1.FunctionSpec{Name: fmt.Sprintf("f%d", i), Image: "unused",
				Local: &v1alpha1.LocalRuntime{Command: []string{"python3", "-c", handler},
					Env: []corev1.EnvVar{{Name: "PYTHONPATH", Value: filepath.Join(root, "sdk", "python")}}}})
			if i > 0 {
				wf.Spec.Dependencies = append(wf.Spec.Dependencies, v1alpha1.Dependency{From: []string{fmt.Sprintf("f%d", i-1)}, To: []string{fmt.Sprintf("f%d", i)}})
			}
		}
		t := time.Now()
		if err := c.Client.Create(ctx, wf); err != nil {
			return err
		}
		if err := waitReady(ctx, c.Client, wf, 10*time.Minute); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "%s: %d functions ready in %s\n", name, length, time.Since(t).Round(time.Millisecond))
		var lat []time.Duration
		for s := 0; s < sessions; s++ {
			t := time.Now()
			out, err := session(c.GatewayURL, name)
			if err != nil {
				return err
			}
			if out != "x" {
				return fmt.Errorf("%s returned %q", name, out)
			}
			if s > 0 {
				lat = append(lat, time.Since(t))
			}
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		p50, p95 := percentile(lat, 0.50), percentile(lat, 0.95)
		fmt.Printf("| %d functions | %d | %s | %s | %s |\n", length, len(lat), p50.Round(10*time.Microsecond), p95.Round(10*time.Microsecond), (p50 / time.Duration(length)).Round(10*time.Microsecond))
		_ = c.Client.Delete(ctx, wf)
	}
	return nil
}

// percentile is the nearest-rank percentile of sorted latencies.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func waitReady(ctx context.Context, c client.Client, wf *v1alpha1.Workflow, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		got := &v1alpha1.Workflow{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(wf), got); err == nil && meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady) {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s", wf.Name, timeout)
}

func session(gateway, wf string) (string, error) {
	resp, err := http.Post(gateway+"/v1/namespaces/bench/workflows/"+wf+"/sessions", "application/octet-stream", strings.NewReader("x"))
	if err != nil {
		return "", err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("start: %s %s", resp.Status, body)
	}
	id := strings.Split(strings.Split(string(body), `"id":"`)[1], `"`)[0]
	r, err := http.Get(gateway + "/v1/namespaces/bench/sessions/" + id + "/result?wait=1m")
	if err != nil {
		return "", err
	}
	defer r.Body.Close()
	out, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		return "", fmt.Errorf("session %s: %s %s", id, r.Status, out)
	}
	return string(out), nil
}
