package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// Workflows, pods and sessions on the local cluster, for the rounds in main.go.

func (b *bench) deploy(wf *v1alpha1.Workflow) error {
	t := time.Now()
	if err := b.c.Client.Create(b.ctx, wf); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Minute)
	for time.Now().Before(deadline) {
		got := &v1alpha1.Workflow{}
		if err := b.c.Client.Get(b.ctx, client.ObjectKeyFromObject(wf), got); err == nil && meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady) {
			fmt.Fprintf(os.Stderr, "%s: ready in %s\n", wf.Name, time.Since(t).Round(time.Millisecond))
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after 10m", wf.Name)
}

// remove deletes a workflow and waits (up to 5 minutes) for its pods to go,
// so that the next part runs on a quiet node.
func (b *bench) remove(wf *v1alpha1.Workflow) {
	_ = b.c.Client.Delete(context.Background(), wf)
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var list corev1.PodList
		if err := b.c.Client.List(b.ctx, &list, client.InNamespace(namespace)); err == nil && len(list.Items) == 0 {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// podCounts counts a Knative Service's pods: all of them (terminating ones
// included), those not being deleted, and the Ready ones among those.
func (b *bench) podCounts(svc string) (all, live, ready int, err error) {
	var list corev1.PodList
	if err := b.c.Client.List(b.ctx, &list, client.InNamespace(namespace), client.MatchingLabels{"serving.knative.dev/service": svc}); err != nil {
		return 0, 0, 0, err
	}
	for _, p := range list.Items {
		all++
		if p.DeletionTimestamp == nil {
			live++
		}
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready++
			}
		}
	}
	return all, live, ready, nil
}

// waitPods waits until ok(all pods, those not being deleted, the Ready
// ones) holds.
func (b *bench) waitPods(svc string, timeout time.Duration, ok func(all, live, ready int) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		all, live, ready, err := b.podCounts(svc)
		if err == nil && ok(all, live, ready) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d pods (%d not terminating, %d ready) after %s (%v)", svc, all, live, ready, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// podWatch lists a Service's pods every 100 ms until stopped: the most pods
// and Ready pods it saw, and when it first saw k Ready pods.
type podWatch struct {
	mu       sync.Mutex
	maxAll   int
	maxReady int
	seen     time.Time // first pod listed
	reached  map[int]time.Time
	done     chan struct{}
	stopped  chan struct{}
}

func (b *bench) watch(svc string) *podWatch {
	w := &podWatch{reached: map[int]time.Time{}, done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(w.stopped)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if all, _, ready, err := b.podCounts(svc); err == nil {
				now := time.Now()
				w.mu.Lock()
				w.maxAll, w.maxReady = max(w.maxAll, all), max(w.maxReady, ready)
				if all > 0 && w.seen.IsZero() {
					w.seen = now
				}
				for k := 1; k <= ready; k++ {
					if _, ok := w.reached[k]; !ok {
						w.reached[k] = now
					}
				}
				w.mu.Unlock()
			}
			select {
			case <-w.done:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *podWatch) stop() {
	close(w.done)
	<-w.stopped
}

func (w *podWatch) readyAt(k int) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reached[k]
}

// session starts a session through the gateway and waits (long polls, up
// to 10 minutes) for its result.
func session(gateway, token, wf, input string) (string, error) {
	do := func(method, url string, body io.Reader) (int, []byte, error) {
		req, err := http.NewRequest(method, url, body)
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	code, body, err := do(http.MethodPost, gateway+"/v1/namespaces/"+namespace+"/workflows/"+wf+"/sessions", strings.NewReader(input))
	if err != nil {
		return "", err
	}
	if code != http.StatusCreated {
		return "", fmt.Errorf("start %s: %d %s", wf, code, body)
	}
	var s struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &s); err != nil || s.ID == "" {
		return "", fmt.Errorf("start %s: %s (%v)", wf, body, err)
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		code, out, err := do(http.MethodGet, gateway+"/v1/namespaces/"+namespace+"/sessions/"+s.ID+"/result?wait=1m", nil)
		if err != nil {
			return "", err
		}
		switch {
		case code == http.StatusOK:
			return string(out), nil
		case code == http.StatusAccepted && time.Now().Before(deadline):
		default:
			return "", fmt.Errorf("session %s: %d %.500s", s.ID, code, out)
		}
	}
}
