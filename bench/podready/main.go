// Command podready measures pod create → Ready on the local Kubernetes
// cluster (internal/localcluster/k8s with the node agent): it starts a cluster with
// two nodes, creates pods of the echo test image with a readiness probe one
// after another (each waits for the previous one to be Ready, so the numbers
// are latencies, not queueing), and reports p50/p95/max of the time from the
// create call's return to the watch event that shows the pod Ready. The
// first pod builds the image's Go package (reported apart, as "first"). It
// also reports the cluster's start time. Needs root; stop `ziptrail local up`
// first (one cluster per host).
//
//	go run ./bench/podready [-pods 30] [-burst 0]
//
// -burst N additionally creates N pods at once and reports the same
// percentiles for them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

func main() {
	pods := flag.Int("pods", 30, "pods created one after another")
	burst := flag.Int("burst", 0, "then this many pods at once (0: none)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *pods, *burst); err != nil {
		fmt.Fprintln(os.Stderr, "podready:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, n, burst int) (err error) {
	dir, err := os.MkdirTemp("", "podready-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	agent := filepath.Join(dir, "ziptrail-node")
	build := exec.CommandContext(ctx, "go", "build", "-o", agent, "./cmd/ziptrail-node")
	build.Dir = paths.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build ziptrail-node: %w: %s", err, out)
	}
	t := time.Now()
	c, err := k8s.Start(ctx, k8s.Options{
		StateDir: dir, Nodes: 2, NodeAgent: agent, NetPrefix: "ztb",
		ClusterCIDR: netip.MustParsePrefix("10.223.0.0/16"), ServiceCIDR: netip.MustParsePrefix("10.99.0.0/16"),
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Stop(context.WithoutCancel(ctx))) }()
	fmt.Printf("cluster start (2 nodes, all components healthy, nodes Ready): %s\n", time.Since(t).Round(time.Millisecond))
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	ns := "podready"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := k8s.WaitDefaultServiceAccount(ctx, cs, ns); err != nil {
		return err
	}
	first, err := createAndWait(ctx, cs, ns, []string{"warm"})
	if err != nil {
		return err
	}
	fmt.Printf("first pod (builds the image's Go package): %s\n", first[0].Round(time.Millisecond))
	var seq []time.Duration
	for i := range n {
		d, err := createAndWait(ctx, cs, ns, []string{fmt.Sprintf("seq-%d", i)})
		if err != nil {
			return err
		}
		seq = append(seq, d...)
	}
	report(fmt.Sprintf("one at a time, %d pods", n), seq)
	if burst > 0 {
		var names []string
		for i := range burst {
			names = append(names, fmt.Sprintf("burst-%d", i))
		}
		ds, err := createAndWait(ctx, cs, ns, names)
		if err != nil {
			return err
		}
		report(fmt.Sprintf("%d at once", burst), ds)
	}
	return nil
}

// createAndWait creates the named pods at once and returns, for each, the
// time from its create call's return until a watch event shows it Ready.
func createAndWait(ctx context.Context, cs kubernetes.Interface, ns string, names []string) ([]time.Duration, error) {
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	created := map[string]time.Time{}
	for _, name := range names {
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod(name), metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		created[name] = time.Now()
	}
	ready := map[string]time.Duration{}
	timeout := time.After(2 * time.Minute)
	for len(ready) < len(names) {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, errors.New("pod watch closed")
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Deleted {
				continue
			}
			start, mine := created[p.Name]
			if _, done := ready[p.Name]; mine && !done && podReady(p) {
				ready[p.Name] = time.Since(start)
			}
		case <-timeout:
			return nil, fmt.Errorf("%d of %d pods Ready after 2 minutes", len(ready), len(names))
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make([]time.Duration, 0, len(names))
	for _, name := range names {
		out = append(out, ready[name])
	}
	return out, nil
}

func pod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers: []corev1.Container{{
				Name: "echo", Image: "ziptrail.dev/e2e/echo:latest",
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func report(what string, ds []time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	pct := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	fmt.Printf("pod create → Ready, %s: p50 %s, p95 %s, max %s\n", what,
		pct(0.50).Round(time.Millisecond), pct(0.95).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}
