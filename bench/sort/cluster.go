package main

// The local cluster side of a run: Redis's memory, sessions through the gateway, readiness.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

func redisUsed(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

func watchRedis(ctx context.Context, rdb *redis.Client, peak *int64) func() {
	done := make(chan struct{})
	fin := make(chan struct{})
	go func() {
		defer close(fin)
		for {
			if u := redisUsed(ctx, rdb); u > *peak {
				*peak = u
			}
			select {
			case <-done:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return func() { close(done); <-fin }
}

// session runs one sort session through the gateway and returns its result
// and its record (start and end times).
//
// While it runs, the session is also polled every second and each snapshot
// given to snapshot (if not nil): the events of the result's 30-second
// long polls would come too late for the phases' times.
func session(gateway, token string, params map[string]any, timeout time.Duration, progress func(time.Duration, string), snapshot func(sessions.Session)) (json.RawMessage, sessions.Session, error) {
	var s sessions.Session
	do := func(method, url string, body io.Reader) ([]byte, int, error) {
		req, err := http.NewRequest(method, url, body)
		if err != nil {
			return nil, 0, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, 0, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return b, resp.StatusCode, err
	}
	in, _ := json.Marshal(params)
	body, code, err := do(http.MethodPost, gateway+"/v1/namespaces/bench/workflows/sort/sessions", strings.NewReader(string(in)))
	if err != nil {
		return nil, s, err
	}
	if code != http.StatusCreated {
		return nil, s, fmt.Errorf("start: %d %s", code, body)
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, s, err
	}
	start := time.Now()
	if snapshot != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
				}
				var st sessions.Session
				if b, code, err := do(http.MethodGet, gateway+"/v1/namespaces/bench/sessions/"+s.ID, nil); err == nil && code == http.StatusOK && json.Unmarshal(b, &st) == nil {
					snapshot(st)
				}
			}
		}()
	}
	var result []byte
	for {
		b, code, err := do(http.MethodGet, gateway+"/v1/namespaces/bench/sessions/"+s.ID+"/result?wait=30s", nil)
		if err != nil {
			return nil, s, err
		}
		if code == http.StatusOK {
			result = b
			break
		}
		if code != http.StatusAccepted {
			return nil, s, fmt.Errorf("session %s: %d %s", s.ID, code, b)
		}
		if time.Since(start) > timeout {
			return nil, s, fmt.Errorf("session %s: no result after %s", s.ID, timeout)
		}
		// what the session is doing: invocations, objects, its last event
		var st sessions.Session
		what := ""
		if b, code, err := do(http.MethodGet, gateway+"/v1/namespaces/bench/sessions/"+s.ID, nil); err == nil && code == http.StatusOK && json.Unmarshal(b, &st) == nil {
			// A failed invocation fails the run (the workflow would re-run it
			// after its 5-minute timeout; a benchmark reports it instead).
			for _, e := range st.Events {
				if e.Kind == "InvokeFailed" {
					return nil, s, fmt.Errorf("session %s: %s: %.300s", s.ID, e.Kind, e.Message)
				}
			}
			what = fmt.Sprintf("%d invocations, %d objects", st.Invocations, st.Objects)
			if n := len(st.Events); n > 0 {
				e := st.Events[n-1]
				what += fmt.Sprintf("; last event %s %s ago: %.160s", e.Kind, time.Since(e.Time).Round(time.Second), e.Message)
			}
		}
		progress(time.Since(start), what)
	}
	b, code, err := do(http.MethodGet, gateway+"/v1/namespaces/bench/sessions/"+s.ID, nil)
	if err != nil {
		return nil, s, err
	}
	if code != http.StatusOK {
		return nil, s, fmt.Errorf("session %s: %d %s", s.ID, code, b)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, s, err
	}
	if snapshot != nil {
		snapshot(s)
	}
	if s.State != sessions.Completed || s.Ended == nil {
		return nil, s, fmt.Errorf("session %s: %s %s", s.ID, s.State, s.Error)
	}
	return result, s, nil
}

func waitReady(ctx context.Context, c client.Client, wf *v1alpha1.Workflow, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		got := &v1alpha1.Workflow{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(wf), got); err == nil && meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady) {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s", wf.Name, timeout)
}
