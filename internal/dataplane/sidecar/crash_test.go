package sidecar

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	pkgnet "knative.dev/pkg/network"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// The function of these tests is a separate OS process (this test binary
// again, running TestHelperCrashFunction) serving HTTP on a fixed port, as
// the user container does in a pod: the test SIGKILLs it while an
// invocation is in flight and starts it again on the same port, as the
// kubelet restarts the container. The sidecar in front of it is the real
// handler behind Knative's own proxy pieces (transport with its dial
// back-off, error handler).

// crashFunction is one run of the function process.
type crashFunction struct {
	cmd *exec.Cmd
	ran chan string // the idempotency key of every invocation it starts
}

// startCrashFunction starts the function on addr and waits until it
// listens. mode: "hang" (every invocation blocks until the process is
// killed), "ok" (answers outputs and a return value), "fail" (answers
// 500 itself).
func startCrashFunction(t *testing.T, addr, mode string) *crashFunction {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCrashFunction$")
	cmd.Env = append(os.Environ(), "ZT_HELPER_FUNCTION_ADDR="+addr, "ZT_HELPER_FUNCTION_MODE="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &crashFunction{cmd: cmd, ran: make(chan string, 16)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			switch line := sc.Text(); {
			case line == "listening":
				close(listening)
			case strings.HasPrefix(line, "run "):
				f.ran <- strings.TrimPrefix(line, "run ")
			}
		}
	}()
	select {
	case <-listening:
	case <-time.After(30 * time.Second):
		t.Fatalf("the function process (%s) did not listen on %s", mode, addr)
	}
	return f
}

// started waits for the function to start an invocation: its key.
func (f *crashFunction) started(t *testing.T) string {
	t.Helper()
	select {
	case k := <-f.ran:
		return k
	case <-time.After(30 * time.Second):
		t.Fatal("the invocation never reached the function process")
		return ""
	}
}

// kill SIGKILLs the process and reaps it.
func (f *crashFunction) kill(t *testing.T) {
	t.Helper()
	if err := f.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = f.cmd.Wait()
}

// TestHelperCrashFunction is the function process of the crash tests.
func TestHelperCrashFunction(t *testing.T) {
	addr := os.Getenv("ZT_HELPER_FUNCTION_ADDR")
	if addr == "" {
		t.Skip("the function process of the crash tests")
	}
	mode := os.Getenv("ZT_HELPER_FUNCTION_MODE")
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "crash function: %v\n", err)
		os.Exit(2)
	}
	fmt.Println("listening")
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var env invocation.Envelope
		if err := json.NewDecoder(r.Body).Decode(&env); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The key the function got, in the envelope and the header.
		fmt.Printf("run %s %s\n", env.IdempotencyKey, r.Header.Get(hdrKey))
		switch mode {
		case "hang":
			select {} // until killed
		case "fail":
			http.Error(w, "boom", http.StatusInternalServerError)
		default:
			w.Header().Set("Content-Type", invocation.OutputsContentType)
			_, _ = w.Write([]byte(`{"objects":[{"bucket":"out","key":"o","inline":"eQ=="}],"return":"cg=="}`))
		}
	}))
	os.Exit(0)
}

// crashSidecar is a sidecar reporting to ev, with crash retries,
// serving invocations in front of the function at addr through a
// reverse proxy made like queue-proxy's (Knative's transport and error
// handler).
func crashSidecar(t *testing.T, ev *endsEvents, addr string, retries int) string {
	t.Helper()
	s := workflowSidecar(t, controlServer(t, ev), "p", "work")
	s.cfg.FunctionCrashRetries = retries
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: addr})
	proxy.Transport = pkgnet.NewProxyAutoTransport(10, 10)
	proxy.ErrorHandler = pkgnet.ErrorHandler(zap.NewNop().Sugar())
	srv := httptest.NewServer(s.Wrap(proxy))
	t.Cleanup(srv.Close)
	return srv.URL
}

// invokeAsync posts env, with its key in the header as the dispatcher
// sends it, and hands back the answer.
func invokeAsync(t *testing.T, u string, env invocation.Envelope) <-chan answer {
	ch := make(chan answer, 1)
	data, _ := json.Marshal(env)
	req, err := http.NewRequest(http.MethodPost, u, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", invocation.ContentType)
	req.Header.Set(hdrKey, env.Key())
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- answer{resp: resp, body: b, err: err}
	}()
	return ch
}

type answer struct {
	resp *http.Response
	body []byte
	err  error
}

func waitAnswer(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a
	case <-time.After(90 * time.Second):
		t.Fatal("no answer to the invocation")
		return answer{}
	}
}

func waitEnd(t *testing.T, ev *endsEvents) *controlv1.FunctionFinished {
	t.Helper()
	select {
	case f := <-ev.ends:
		return f
	case <-time.After(30 * time.Second):
		t.Fatal("no end reported")
		return nil
	}
}

// noMoreRuns checks that no process started the invocation again (the
// answer came after any run; a moment lets its line come through).
func noMoreRuns(t *testing.T, fs ...*crashFunction) {
	t.Helper()
	time.Sleep(100 * time.Millisecond)
	for i, f := range fs {
		select {
		case k := <-f.ran:
			t.Errorf("function process %d ran the invocation once more (%s)", i+1, k)
		default:
		}
	}
}

// TestFunctionKilledMidCallRunsAgain: the function's process is SIGKILLed
// while it runs an invocation (no answer yet) and its container comes
// back 300 ms later on the same port. The sidecar waits for it and sends
// the invocation again with the same key: the caller gets the function's
// success, the function ran twice for the key (once killed, once to the
// end), the outcome reported is a success, and a duplicate delivery is
// answered from the record (the record holds the final outcome).
func TestFunctionKilledMidCallRunsAgain(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(servers.FreePort(t)))
	ev := &endsEvents{ends: make(chan *controlv1.FunctionFinished, 16)}
	u := crashSidecar(t, ev, addr, 2)
	retries0 := testutil.ToFloat64(functionCrashRetries)
	env := invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: "s1.3",
		Objects: []invocation.Object{{Bucket: "in", Key: "k", Inline: []byte("x")}}}
	const key = "s1/s1.3/0"

	first := startCrashFunction(t, addr, "hang")
	got := invokeAsync(t, u, env)
	if k := first.started(t); k != key+" "+key {
		t.Fatalf("the function got the keys %q, want %q in the envelope and the header", k, key)
	}
	first.kill(t)
	time.Sleep(300 * time.Millisecond) // the kubelet restarts the container
	second := startCrashFunction(t, addr, "ok")
	if k := second.started(t); k != key+" "+key {
		t.Fatalf("the restarted function got the keys %q, want %q", k, key)
	}

	a := waitAnswer(t, got)
	if a.resp.StatusCode != http.StatusOK || !strings.Contains(string(a.body), `"return":"cg=="`) || a.resp.Header.Get(hdrKey) != key {
		t.Fatalf("answer %d %q (key %q), want the function's success", a.resp.StatusCode, a.body, a.resp.Header.Get(hdrKey))
	}
	noMoreRuns(t, first, second) // ran twice for the key in all
	if d := testutil.ToFloat64(functionCrashRetries) - retries0; d != 1 {
		t.Errorf("ziptrail_sidecar_function_crash_retries_total grew by %v, want 1", d)
	}
	if f := waitEnd(t, ev); f.InvocationId != "s1.3" || f.Failed || string(f.ReturnValue) != "r" || f.OutputsSent != 1 {
		t.Fatalf("reported end %v, want the success", f)
	}

	// A duplicate of the key gets the recorded success, the function
	// does not run again.
	resp, body := post(t, u, env)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(hdrReplay) != "1" || !bytes.Equal(body, a.body) {
		t.Fatalf("duplicate: %d %q (replayed %q)", resp.StatusCode, body, resp.Header.Get(hdrReplay))
	}
	noMoreRuns(t, second)
}

// TestFunctionKilledEveryTimeFails: the function's process dies on every
// delivery. After the retries (2: three runs in all) the caller gets 502
// saying so, the end is reported failed with the same words, and the
// record holds that answer.
func TestFunctionKilledEveryTimeFails(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(servers.FreePort(t)))
	ev := &endsEvents{ends: make(chan *controlv1.FunctionFinished, 16)}
	u := crashSidecar(t, ev, addr, 2)
	retries0 := testutil.ToFloat64(functionCrashRetries)
	env := invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: "s1.5"}
	const key = "s1/s1.5/0"

	var got <-chan answer
	var runs []*crashFunction
	for i := range 3 {
		if i > 0 {
			time.Sleep(300 * time.Millisecond)
		}
		f := startCrashFunction(t, addr, "hang")
		runs = append(runs, f)
		if i == 0 {
			got = invokeAsync(t, u, env)
		}
		if k := f.started(t); k != key+" "+key {
			t.Fatalf("run %d got the keys %q, want %q", i+1, k, key)
		}
		f.kill(t)
	}

	const want = "the function's process exited before answering (3 attempts)"
	a := waitAnswer(t, got)
	t.Logf("answer %d %q", a.resp.StatusCode, a.body)
	if a.resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(a.body), want) {
		t.Fatalf("answer %d %q, want 502 saying %q", a.resp.StatusCode, a.body, want)
	}
	noMoreRuns(t, runs...)
	if d := testutil.ToFloat64(functionCrashRetries) - retries0; d != 2 {
		t.Errorf("ziptrail_sidecar_function_crash_retries_total grew by %v, want 2", d)
	}
	if f := waitEnd(t, ev); f.InvocationId != "s1.5" || !f.Failed || !strings.Contains(f.Error, want) {
		t.Fatalf("reported end %v, want a failure saying %q", f, want)
	}
	resp, body := post(t, u, env)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(hdrReplay) != "1" || !strings.Contains(string(body), want) {
		t.Fatalf("duplicate: %d %q (replayed %q)", resp.StatusCode, body, resp.Header.Get(hdrReplay))
	}
}

// TestFunctionAnswering500IsNotRunAgain: a function that answers 500
// itself answered: its failure is the outcome, it is not sent again.
func TestFunctionAnswering500IsNotRunAgain(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(servers.FreePort(t)))
	ev := &endsEvents{ends: make(chan *controlv1.FunctionFinished, 16)}
	u := crashSidecar(t, ev, addr, 2)
	retries0 := testutil.ToFloat64(functionCrashRetries)
	env := invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: "s1.6"}

	f := startCrashFunction(t, addr, "fail")
	a := waitAnswer(t, invokeAsync(t, u, env))
	if a.resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(a.body), "boom") {
		t.Fatalf("answer %d %q, want the function's 500", a.resp.StatusCode, a.body)
	}
	if k := f.started(t); k != "s1/s1.6/0 s1/s1.6/0" {
		t.Fatalf("the function got the keys %q", k)
	}
	noMoreRuns(t, f) // ran once
	if d := testutil.ToFloat64(functionCrashRetries) - retries0; d != 0 {
		t.Errorf("ziptrail_sidecar_function_crash_retries_total grew by %v, want 0", d)
	}
	if e := waitEnd(t, ev); e.InvocationId != "s1.6" || !e.Failed || !strings.Contains(e.Error, "answered 500") {
		t.Fatalf("reported end %v, want the function's failure", e)
	}
}

// TestFunctionDownWhenCalledRunsOnceBack: the invocation arrives while
// the function's container is being restarted (connection refused). The
// sidecar waits for it and the function runs once.
func TestFunctionDownWhenCalledRunsOnceBack(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(servers.FreePort(t)))
	ev := &endsEvents{ends: make(chan *controlv1.FunctionFinished, 16)}
	u := crashSidecar(t, ev, addr, 2)
	retries0 := testutil.ToFloat64(functionCrashRetries)
	env := invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: "s1.8"}

	got := invokeAsync(t, u, env)
	time.Sleep(300 * time.Millisecond)
	f := startCrashFunction(t, addr, "ok")
	a := waitAnswer(t, got)
	if a.resp.StatusCode != http.StatusOK || !strings.Contains(string(a.body), `"return":"cg=="`) {
		t.Fatalf("answer %d %q, want the function's success", a.resp.StatusCode, a.body)
	}
	if k := f.started(t); k != "s1/s1.8/0 s1/s1.8/0" {
		t.Fatalf("the function got the keys %q", k)
	}
	noMoreRuns(t, f)
	if d := testutil.ToFloat64(functionCrashRetries) - retries0; d != 1 {
		t.Errorf("ziptrail_sidecar_function_crash_retries_total grew by %v, want 1", d)
	}
	if e := waitEnd(t, ev); e.InvocationId != "s1.8" || e.Failed {
		t.Fatalf("reported end %v, want the success", e)
	}
}

// TestInvocationTimeoutIsNotRetried: an invocation that runs into the
// revision's timeout gets no answer from the function either, but it is
// not sent again: the proxy's 502 passes, as before.
func TestInvocationTimeoutIsNotRetried(t *testing.T) {
	ev := &endsEvents{ends: make(chan *controlv1.FunctionFinished, 16)}
	s := workflowSidecar(t, controlServer(t, ev), "p", "work")
	s.cfg.FunctionCrashRetries, s.cfg.RevisionTimeout = 2, time.Second
	retries0 := testutil.ToFloat64(functionCrashRetries)
	var runs atomic.Int32
	user := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		runs.Add(1)
		<-r.Context().Done() // past the timeout: the proxy hangs up
	}))
	t.Cleanup(user.Close)
	target, _ := url.Parse(user.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = pkgnet.NewProxyAutoTransport(10, 10)
	proxy.ErrorHandler = pkgnet.ErrorHandler(zap.NewNop().Sugar())
	srv := httptest.NewServer(s.Wrap(proxy))
	t.Cleanup(srv.Close)

	env := invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: "s1.9"}
	a := waitAnswer(t, invokeAsync(t, srv.URL, env))
	if a.resp.StatusCode != http.StatusBadGateway || strings.Contains(string(a.body), "exited") {
		t.Fatalf("answer %d %q, want the proxy's 502", a.resp.StatusCode, a.body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the function ran %d times", n)
	}
	if d := testutil.ToFloat64(functionCrashRetries) - retries0; d != 0 {
		t.Errorf("ziptrail_sidecar_function_crash_retries_total grew by %v, want 0", d)
	}
	if e := waitEnd(t, ev); e.InvocationId != "s1.9" || !e.Failed {
		t.Fatalf("reported end %v, want a failure", e)
	}
}
