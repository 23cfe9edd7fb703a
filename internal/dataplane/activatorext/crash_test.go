package activatorext

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestForgedReferencesWhileKeysAreReadNeverPanic plays the attacker of
// issue 31: requests through the activator's handler whose Ziptrail-Refs
// carry references under unknown key ids, many at once, while the
// operator answers key reads slowly. An unknown key id makes the
// keep-alive read the namespace's keys again; a keep-alive round whose
// time ends while it waits for another request's read got no key client
// back, and used it anyway: a nil dereference on the keep-alive goroutine,
// which killed the activator process (all of the cluster's cold starts).
// Every request must get its answer and the process must live on.
func TestForgedReferencesWhileKeysAreReadNeverPanic(t *testing.T) {
	p := startProducer(t)
	sec := &secrets{}
	sec.set(testNS, p.keys, "k1")
	slow := func(ctx context.Context, ns string) (map[string][]byte, string, error) {
		// A slow operator (or API server behind it): reads overlap with
		// keep-alive rounds that end.
		t := time.NewTimer(10 * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, "", ctx.Err()
		}
		return sec.get(ctx, ns)
	}
	dp := &DataPlaneExtender{Keys: slow, MinReread: time.Nanosecond}
	defer dp.Close()
	if err := dp.Extend(context.Background(), testNS, p.put(t, "real", time.Now().Add(time.Minute)), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	m, count := testMetrics(t)
	h := &Handler{
		KeepAlive: &Periodic{Extend: dp.Extend, Interval: 3 * time.Millisecond, Metrics: m},
		Namespace: func(*http.Request) string { return testNS },
		Metrics:   m,
		// The activator holds the request while it waits for a pod.
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t := time.NewTimer(20 * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
			case <-r.Context().Done():
			}
			w.WriteHeader(http.StatusNoContent)
		}),
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	const clients, each = 32, 8
	var wg sync.WaitGroup
	errs := make(chan error, clients*each)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
				req.Header.Set(HeaderRefs, strings.Join([]string{forgedRef(), forgedRef(), "zt1.AXg"}, ","))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					continue
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					errs <- &statusError{resp.StatusCode}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a request through the handler: %v", err)
	}
	if n := count("ziptrail.activator.keepalive.requests", "", ""); n != clients*each {
		t.Errorf("keep-alives started: %d, want %d", n, clients*each)
	}
	if n := count("ziptrail.activator.keepalive.extends", "result", ResultExtended); n != 0 {
		t.Errorf("forged references extended %d times, want none", n)
	}
}

type statusError struct{ code int }

func (e *statusError) Error() string { return http.StatusText(e.code) }

// TestAPanicInAKeepAliveIsCountedNotFatal: whatever a defect lets input
// do on the keep-alive goroutine, the activator lives on; the panic is
// counted and the keep-alive ends.
func TestAPanicInAKeepAliveIsCountedNotFatal(t *testing.T) {
	m, count := testMetrics(t)
	entered := make(chan struct{})
	p := &Periodic{Metrics: m, Interval: time.Hour, Extend: func(context.Context, string, string, time.Time) error {
		close(entered)
		panic("a defect reached by input")
	}}
	stop := p.KeepAlive(context.Background(), testNS, []string{forgedRef()})
	<-entered
	stop() // returns: the goroutine ended (and closed done) despite the panic
	if n := count("ziptrail.activator.panics", "where", "keepalive"); n != 1 {
		t.Errorf("panics counted: %d, want 1", n)
	}
}
