package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// load is closed-loop clients: each starts a session of a random
// workflow through the gateway of a random replica (as the gateway
// Service spreads connections, knowing nothing of owners), waits for its
// result through a random replica again, and starts the next.
type load struct {
	owners   map[string]string // workflow -> owner replica's address
	replicas []string
	token    string
	chain    string // what the steps append to the input: "|<wf>-step0|<wf>-step1..." without <wf>-
	http     *http.Client

	recording atomic.Bool
	mu        sync.Mutex
	latencies []time.Duration // sessions that completed while recording
	requests  int             // gateway requests sent while recording
	proxied   int             // ... to a replica that does not own the workflow
	errors    int
	lastErr   string
}

func newLoad(owners map[string]string, replicas []string, token string, clients, steps int) *load {
	chain := ""
	for i := range steps {
		chain += "|" + fnName(i)
	}
	tr := &http.Transport{MaxIdleConns: 4 * clients, MaxIdleConnsPerHost: 2 * clients, IdleConnTimeout: time.Minute}
	return &load{owners: owners, replicas: replicas, token: token, chain: chain, http: &http.Client{Transport: tr, Timeout: time.Minute}}
}

// run drives clients until ctx ends.
func (l *load) run(ctx context.Context, clients int) *sync.WaitGroup {
	wfs := make([]string, 0, len(l.owners))
	for wf := range l.owners {
		wfs = append(wfs, wf)
	}
	slices.Sort(wfs)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			for ctx.Err() == nil {
				wf := wfs[rng.IntN(len(wfs))]
				began := time.Now()
				err := l.session(ctx, rng, wf, fmt.Sprintf("input %d", i))
				if ctx.Err() != nil {
					return
				}
				l.mu.Lock()
				if err != nil {
					l.errors++
					l.lastErr = err.Error()
				} else if l.recording.Load() {
					l.latencies = append(l.latencies, time.Since(began))
				}
				l.mu.Unlock()
				if err != nil {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	return &wg
}

// session runs one session: POST start, then GET result?wait until 200.
func (l *load) session(ctx context.Context, rng *rand.Rand, wf, input string) error {
	var s struct {
		ID string `json:"id"`
	}
	body, code, err := l.call(ctx, rng, wf, http.MethodPost, "/v1/namespaces/"+namespace+"/workflows/"+wf+"/sessions", input)
	if err != nil {
		return err
	}
	if code != http.StatusCreated {
		return fmt.Errorf("start %s: %d %s", wf, code, truncate(body))
	}
	if err := json.Unmarshal(body, &s); err != nil || s.ID == "" {
		return fmt.Errorf("start %s: %v: %s", wf, err, truncate(body))
	}
	for {
		body, code, err = l.call(ctx, rng, wf, http.MethodGet, "/v1/namespaces/"+namespace+"/sessions/"+s.ID+"/result?wait=30s", "")
		if err != nil {
			return err
		}
		switch code {
		case http.StatusOK:
			// Every step appended its name: the chain ran whole.
			if want := input + strings.ReplaceAll(l.chain, "|", "|"+wf+"-"); string(body) != want {
				return fmt.Errorf("session %s: result %q, want %q", s.ID, truncate(body), want)
			}
			return nil
		case http.StatusAccepted:
			continue
		default:
			return fmt.Errorf("result of %s: %d %s", s.ID, code, truncate(body))
		}
	}
}

// call sends one gateway request to a random replica.
func (l *load) call(ctx context.Context, rng *rand.Rand, wf, method, path, body string) ([]byte, int, error) {
	target := l.replicas[rng.IntN(len(l.replicas))]
	req, err := http.NewRequestWithContext(ctx, method, "http://"+target+":"+gatewayPort+path, strings.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+l.token)
	if l.recording.Load() {
		l.mu.Lock()
		l.requests++
		if l.owners[wf] != target {
			l.proxied++
		}
		l.mu.Unlock()
	}
	resp, err := l.http.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return b, resp.StatusCode, err
}

// take returns what was recorded and resets it.
func (l *load) take() (lat []time.Duration, requests, proxied, errs int, lastErr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lat, requests, proxied, errs, lastErr = l.latencies, l.requests, l.proxied, l.errors, l.lastErr
	l.latencies, l.requests, l.proxied, l.errors, l.lastErr = nil, 0, 0, 0, ""
	return
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

// percentile of sorted durations, in milliseconds.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return float64(sorted[i].Microseconds()) / 1000
}

// completed is the number of sessions recorded so far.
func (l *load) completed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.latencies)
}
