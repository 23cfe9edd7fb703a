package orchestrator

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/sidecar"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// keptRig is the acc workflow whose entry runs behind a real sidecar with
// a control stream to the operator at addr; its answer carries the object
// that fires sink. Reports kept by the sidecar wait an hour for their
// release: only a release or a new stream ends their wait.
func keptRig(t *testing.T, addr string) (entry *sidecar.Sidecar, fns *servers.Functions, sinks *atomic.Int32) {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("pod:ns:entry-1"), 0o600); err != nil {
		t.Fatal(err)
	}
	entry = sidecar.New(sidecar.Config{Namespace: "ns", Workflow: "acc", Function: "entry", Pod: "entry-1", PodIP: "127.0.0.1",
		DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(), MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute,
		OperatorAddr: addr, TokenFile: tok, KeepReportsFor: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := entry.Start(ctx); err != nil {
		t.Fatal(err)
	}
	fns = &servers.Functions{}
	fns.Add(t, "acc-entry", entry.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		_ = json.NewEncoder(w).Encode(invocation.Outputs{Objects: []invocation.Object{{Bucket: "acc", Key: "k1", Inline: []byte("x")}}})
	})))
	sinks = &atomic.Int32{}
	fns.Add(t, "acc-sink", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { sinks.Add(1) }))
	return entry, fns, sinks
}

// keptReports reads the sidecar's ziptrail_sidecar_reports_kept.
func keptReports(t *testing.T, s *sidecar.Sidecar) int {
	t.Helper()
	rec := httptest.NewRecorder()
	s.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ziptrail_sidecar_reports_kept "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}
	}
	t.Fatal("no ziptrail_sidecar_reports_kept in the sidecar's metrics")
	return 0
}

// The report of an invocation the dispatcher sent is a second copy of its
// answer: the sidecar keeps it, and the operator releases it once a save
// holds the answer, so that it is never sent (a step costs one report, not
// two: docs/guarantees.md, "What durability costs a step").
func TestAKeptReportIsReleasedOnceTheAnswerIsSaved(t *testing.T) {
	rs := servers.StartRedis(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(servers.FreePort(t)))
	entry, fns, sinks := keptRig(t, addr)
	wf, _, _ := accWorkflow(t)
	op := startAckRig(t, addr, rs.Addr, wf, fns, 20*time.Millisecond)
	// On a stream that is up: a new stream sends what was kept before it.
	waitFor(t, "the entry's control stream", func() bool { return len(op.srv.Sidecars("ns")) == 1 })
	if _, err := op.o.StartSession(context.Background(), "ns", "acc", []byte("in")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sink fired by the entry's answer", func() bool { return sinks.Load() == 1 })
	waitFor(t, "the kept report released after a save", func() bool { return keptReports(t, entry) == 0 })
	if n, m := op.events.finished.Load(), op.events.objects.Load(); n != 0 || m != 0 {
		t.Errorf("the sidecar sent %d outcomes and %d objects the operator had from the answer and released", n, m)
	}
}

// The operator crashes after it applied the answer and before any save:
// the next owner learns the entry's outcome from the report the sidecar
// kept, which it sends on its new stream (waiting for a release that the
// crashed owner will never send would strand the session).
func TestAnAnswerNotSavedReachesTheNextOwnerByItsKeptReport(t *testing.T) {
	rs := servers.StartRedis(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(servers.FreePort(t)))
	entry, fns, sinks := keptRig(t, addr)
	wf, _, _ := accWorkflow(t)
	// The first operator saves only the start.
	first := startAckRig(t, addr, rs.Addr, wf, fns, time.Hour)
	id, err := first.o.StartSession(context.Background(), "ns", "acc", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sink fired by the entry's answer", func() bool { return sinks.Load() == 1 })
	if n := keptReports(t, entry); n != 1 {
		t.Fatalf("%d reports kept before any save, want 1", n)
	}
	first.crash()

	second := startAckRig(t, addr, rs.Addr, wf, fns, 20*time.Millisecond)
	waitFor(t, "the session restored", func() bool { _, err := second.o.Sessions().Get(id); return err == nil })
	waitForLong(t, time.Minute, "the entry's outcome at the next owner (sink fired again)", func() bool { return sinks.Load() == 2 })
	if second.events.finished.Load() == 0 {
		t.Error("the next owner learnt the entry's outcome, but not from its sidecar's report")
	}
	waitFor(t, "no report kept", func() bool { return keptReports(t, entry) == 0 })
}
