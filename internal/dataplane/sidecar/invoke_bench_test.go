package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// BenchmarkInvoke: one invocation over real HTTP on loopback to a function
// that answers a small return value, straight ("floor") and through the
// sidecar's handler ("sidecar": fence, decode, idempotency record,
// detached run; "sidecar-reporting": and the outcome reported over a real
// control stream; "sidecar-dispatched": the report kept for a release
// instead, as for the operator's dispatcher, which asks for it with
// invocation.HeaderKeepReport), the in-process part of bench/chain's floor path without
// Knative and the operator. Side by side in one run:
//
//	go test -run XXX -bench Invoke -count 5 ./internal/dataplane/sidecar/
func BenchmarkInvoke(b *testing.B) {
	s := New(Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(b), ShmDir: b.TempDir(),
		MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.Start(ctx); err != nil {
		b.Fatal(err)
	}
	fn := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte("ok"))
	})
	// The same with the sidecar's control stream to a real control server:
	// every invocation's outcome reported (FunctionFinished), as in a pod.
	reporting := workflowSidecar(b, controlServer(b, &orderedEvents{}), "p", "f")
	for _, c := range []struct {
		name string
		h    http.Handler
		keep bool
	}{{"floor", fn, false}, {"sidecar", s.Wrap(fn), false}, {"sidecar-reporting", reporting.Wrap(fn), false}, {"sidecar-dispatched", reporting.Wrap(fn), true}} {
		b.Run(c.name, func(b *testing.B) {
			srv := httptest.NewServer(c.h)
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			defer client.CloseIdleConnections()
			b.ReportAllocs()
			// Ids of their own in every run (-count): a repeated one would
			// be answered from the sidecar's idempotency record.
			run := time.Now().UnixNano()
			for i := 0; b.Loop(); i++ {
				postEnvelope(b, client, srv.URL, invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-f", Session: "s1",
					Invocation: fmt.Sprintf("s1.%s.%d.%d", c.name, run, i), Args: []byte("hello")}, c.keep)
			}
		})
	}
}

// postEnvelope sends env as the dispatcher does (keep: its report kept
// for the operator's answer) and wants a 200.
func postEnvelope(b *testing.B, client *http.Client, url string, env invocation.Envelope, keep bool) {
	data, _ := json.Marshal(env)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(data))
	req.Header.Set("Content-Type", invocation.ContentType)
	if keep {
		req.Header.Set(invocation.HeaderKeepReport, "1")
	}
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatal(resp.StatusCode)
	}
}
