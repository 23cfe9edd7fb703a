package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
)

// followOperatorLogs streams the log of every operator container there is
// during the run (each restart and each pod of a rollout its own file in
// dir), until ctx ends: a SIGKILLed container's log is gone from the API
// after its next restart, and a rolled-out pod's with the pod, but a stuck
// session is understood only from the owner that lost it.
func (m *modeRun) followOperatorLogs(ctx context.Context, dir string) (wait func()) {
	var wg sync.WaitGroup
	followed := map[string]bool{} // pod/container/restart count
	poll := func() {
		pods, err := m.rel.OperatorPods(ctx)
		if err != nil {
			return
		}
		for _, p := range pods {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Running == nil {
					continue
				}
				key := fmt.Sprintf("%s-%s-%d", p.Name, cs.Name, cs.RestartCount)
				if followed[key] {
					continue
				}
				followed[key] = true
				wg.Add(1)
				go func(pod, container, file string) {
					defer wg.Done()
					m.followLog(ctx, pod, container, filepath.Join(dir, file+".log"))
				}(p.Name, cs.Name, key)
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			poll()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return wg.Wait
}

func (m *modeRun) followLog(ctx context.Context, pod, container, file string) {
	f, err := os.Create(file)
	if err != nil {
		return
	}
	defer f.Close()
	req := m.cluster.Clientset.CoreV1().Pods(m.rel.Namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container, Follow: true, Timestamps: true})
	stream, err := req.Stream(ctx)
	if err != nil {
		fmt.Fprintf(f, "(no log stream: %v)\n", err)
		return
	}
	defer stream.Close()
	_, _ = io.Copy(f, stream)
}

// explainStuck writes what is known of each stuck session: the gateway's
// view of it and its retained events, the function runs the effects file
// saw, and the operator's log lines that name it.
func (m *modeRun) explainStuck(ctx context.Context, logDir string) {
	m.mu.Lock()
	var stuck []*sessionRun
	for _, s := range m.sessions {
		if s.outcome == outcomeStuck && s.id != "" {
			stuck = append(stuck, s)
		}
	}
	m.mu.Unlock()
	if len(stuck) == 0 {
		return
	}
	effects, _ := readEffects(m.effects)
	for i, s := range stuck {
		if i == 5 {
			fmt.Fprintf(m.out, "--- %d more stuck sessions\n", len(stuck)-i)
			break
		}
		fmt.Fprintf(m.out, "--- stuck session %s (%s, started %s, phase %s)\n", s.id, s.shape, s.started.Format("15:04:05.000"), m.phases[s.phase])
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if st, err := m.gw.GetSession(cctx, s.id); err != nil {
			fmt.Fprintf(m.out, "    gateway: %v\n", err)
		} else {
			fmt.Fprintf(m.out, "    gateway: %s, %d invocations, %d objects, error %q\n", st.State, st.Invocations, st.Objects, st.Error)
		}
		wctx, wcancel := context.WithTimeout(cctx, 3*time.Second)
		for e, err := range m.gw.Watch(wctx, s.id) {
			if err != nil {
				break
			}
			fmt.Fprintf(m.out, "    event %s %s %s\n", e.Time.Format("15:04:05.000"), e.Kind, trim(e.Message, 200))
		}
		wcancel()
		cancel()
		for _, e := range effects {
			if e.session == s.id {
				fmt.Fprintf(m.out, "    ran %s %s attempt %s key %s\n", e.rec.fn, e.rec.id, e.rec.attempt, e.rec.key)
			}
		}
		for _, l := range m.checkpointOf(ctx, s.id) {
			fmt.Fprintf(m.out, "    checkpoint %s\n", l)
		}
		for _, l := range grepLogs(logDir, s.id, 40) {
			fmt.Fprintf(m.out, "    log %s\n", trim(l, 400))
		}
	}
	fmt.Fprintf(m.out, "--- the operator's logs: %s\n", logDir)
}

// checkpointOf returns the session's parts of the engine checkpoints in
// Redis (every hash with a snapshot: one per bucket when sharded): its
// engine state and its registry entry, as JSON.
func (m *modeRun) checkpointOf(ctx context.Context, id string) []string {
	rdb := redis.NewClient(&redis.Options{Addr: m.cluster.RedisAddr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out []string
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		data, err := rdb.HGet(ctx, key, "data").Result()
		if err != nil {
			continue
		}
		var st struct {
			Engine struct {
				Sessions []json.RawMessage `json:"sessions"`
			} `json:"engine"`
			Sessions []json.RawMessage `json:"sessions"`
		}
		if json.Unmarshal([]byte(data), &st) != nil {
			continue
		}
		gen, _ := rdb.HGet(ctx, key, "gen").Result()
		for _, raw := range append(st.Engine.Sessions, st.Sessions...) {
			var head struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(raw, &head) == nil && head.ID == id {
				out = append(out, fmt.Sprintf("%s (gen %s): %s", key, gen, raw))
			}
		}
	}
	return out
}

// grepLogs returns up to max lines of the logs in dir that contain s,
// prefixed by their file, in time order.
func grepLogs(dir, s string, max int) []string {
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var out []string
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if strings.Contains(sc.Text(), s) {
				out = append(out, sc.Text()+"  ["+strings.TrimSuffix(filepath.Base(name), ".log")+"]")
			}
		}
		f.Close()
	}
	sort.Strings(out) // each line starts with its timestamp
	if len(out) > max {
		out = out[:max]
	}
	return out
}
