package nodeagent_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// BenchmarkPodCreateToReady measures pod create → Ready (as seen by a
// watch) for an echo pod with a readiness probe, one pod at a time, and
// reports p50/p95.
func BenchmarkPodCreateToReady(b *testing.B) {
	ctx := context.Background()
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ztn-bench-"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}) }()
	var lat []time.Duration
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("bench-%d", i)
		w, err := client.CoreV1().Pods(ns.Name).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := client.CoreV1().Pods(ns.Name).Create(ctx, echoPod(ns.Name, name, nodes[i%2].Name), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Modified && isReady(p) {
				break
			}
		}
		lat = append(lat, time.Since(start))
		w.Stop()
		zero := int64(0)
		_ = client.CoreV1().Pods(ns.Name).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*95/100].Milliseconds()), "p95-ms")
}
