package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/ziptrail/ziptrail/internal/gateway"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/sessions"
)

// gatewayFlags are the flags of the commands that talk to a session gateway.
type gatewayFlags struct {
	gateway, namespace, stateDir string
	kubeconfig, token            string
}

func (g *gatewayFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.gateway, "gateway", os.Getenv("ZIPTRAIL_GATEWAY"), "session gateway URL (default: the running `ziptrail local up`'s, from its state dir)")
	fs.StringVar(&g.namespace, "n", "default", "namespace of the workflow")
	fs.StringVar(&g.stateDir, "state-dir", defaultStateDir(), "state dir of `ziptrail local up`")
	fs.StringVar(&g.kubeconfig, "kubeconfig", "", "kubeconfig whose credentials the gateway checks (default: $KUBECONFIG, the running `ziptrail local up`'s, ~/.kube/config, in-cluster)")
	fs.StringVar(&g.token, "token", os.Getenv("ZIPTRAIL_TOKEN"), "bearer token to send instead of the kubeconfig's credentials ($ZIPTRAIL_TOKEN)")
}

// url finds the gateway: the flag, $ZIPTRAIL_GATEWAY, or the state file a
// running `ziptrail local up` wrote.
func (g *gatewayFlags) url() (string, error) {
	if g.gateway != "" {
		if !strings.Contains(g.gateway, "://") {
			return "http://" + g.gateway, nil
		}
		return strings.TrimSuffix(g.gateway, "/"), nil
	}
	st, err := localcluster.ReadState(g.stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("no local cluster is running (no %s): start one with `ziptrail local up`, or pass --gateway", localcluster.StateFile(g.stateDir))
	}
	if err != nil {
		return "", err
	}
	return st.GatewayURL, nil
}

// client is an HTTP client sending the user's Kubernetes credentials, which
// the gateway authenticates (TokenReview) and authorizes
// (SubjectAccessReview): --token, else the kubeconfig of --kubeconfig,
// $KUBECONFIG, the running local cluster (unless --gateway names another),
// then ~/.kube/config or in-cluster.
func (g *gatewayFlags) client() (*http.Client, error) {
	if g.token != "" {
		return &http.Client{Transport: gateway.TokenCredentials(g.token).Transport(nil)}, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	switch {
	case g.kubeconfig != "":
		rules.ExplicitPath = g.kubeconfig
	case os.Getenv(clientcmd.RecommendedConfigPathEnvVar) != "":
	default:
		if st, err := localcluster.ReadState(g.stateDir); err == nil && st.Kubeconfig != "" && (g.gateway == "" || strings.TrimSuffix(g.gateway, "/") == st.GatewayURL) {
			rules.ExplicitPath = st.Kubeconfig
		}
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("Kubernetes credentials for the session gateway (pass --kubeconfig or --token): %w", err)
	}
	creds, err := gateway.NewCredentials(cfg)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: creds.Transport(nil)}, nil
}

// parseInterleaved parses flags that may come before or after the
// positional arguments (`run wordcount --input x` and `run --input x wordcount`).
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// runRun implements `ziptrail run WORKFLOW --input FILE|-`: it starts a
// session through the gateway, prints its progress to stderr as it happens
// and its result to stdout.
func runRun(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var g gatewayFlags
	g.register(fs)
	input := fs.String("input", "", "the session input: a file, or - for stdin (default: empty)")
	quiet := fs.Bool("q", false, "print only the result")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up waiting for the result after this long")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: ziptrail run WORKFLOW [--input FILE|-] [-n NAMESPACE] [-q]")
	}
	wf := pos[0]
	body, size, closeInput, err := openInput(*input, stdin)
	if err != nil {
		return fmt.Errorf("read input: %w", err)
	}
	defer closeInput()
	gw, err := g.url()
	if err != nil {
		return err
	}
	hc, err := g.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	progress := stderr
	if *quiet {
		progress = io.Discard
	}

	var s sessions.Session
	if err := call(ctx, hc, http.MethodPost, fmt.Sprintf("%s/v1/namespaces/%s/workflows/%s/sessions", gw, g.namespace, url.PathEscape(wf)),
		body, size, http.StatusCreated, &s); err != nil {
		return fmt.Errorf("start a session of %s/%s: %w", g.namespace, wf, err)
	}
	fmt.Fprintf(progress, "==> session %s of %s/%s started (%d bytes of input)\n", s.ID, g.namespace, wf, size)

	// Progress streams while the result is awaited; the result request
	// returns when the session ends, and the stream then ends too.
	streamed := make(chan struct{})
	go func() {
		defer close(streamed)
		streamEvents(ctx, hc, gw, g.namespace, s.ID, s.Started, progress)
	}()
	// The result streams to stdout as it arrives, whatever its size.
	res := &lastByte{w: stdout}
	err = awaitResult(ctx, hc, gw, g.namespace, s.ID, res)
	final := s
	if gerr := call(ctx, hc, http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s", gw, g.namespace, s.ID), nil, 0, http.StatusOK, &final); gerr == nil {
		select { // let the last events print before the summary
		case <-streamed:
		case <-time.After(2 * time.Second):
		}
	}
	if err != nil {
		return fmt.Errorf("session %s: %w", s.ID, err)
	}
	took := ""
	if final.Ended != nil {
		took = " in " + final.Ended.Sub(final.Started).Round(time.Millisecond).String()
	}
	fmt.Fprintf(progress, "==> %s%s: %d invocations, %d objects; result %d bytes\n", final.State, took, final.Invocations, final.Objects, res.n)
	if res.n > 0 && res.last != '\n' {
		fmt.Fprintln(stdout)
	}
	return nil
}

// openInput opens the session input: a file (streamed, its length known),
// stdin (read whole unless it is a file), or nothing.
func openInput(name string, stdin io.Reader) (io.Reader, int64, func(), error) {
	switch name {
	case "":
		return strings.NewReader(""), 0, func() {}, nil
	case "-":
		if f, ok := stdin.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
				return f, st.Size(), func() {}, nil
			}
		}
		data, err := io.ReadAll(stdin)
		return bytes.NewReader(data), int64(len(data)), func() {}, err
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, 0, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, nil, err
	}
	return f, st.Size(), func() { f.Close() }, nil
}

// lastByte counts what passes and remembers the last byte.
type lastByte struct {
	w    io.Writer
	n    int64
	last byte
}

func (l *lastByte) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	if n > 0 {
		l.n += int64(n)
		l.last = p[n-1]
	}
	return n, err
}

// awaitResult long-polls the result until the session ends and copies it
// to out as it arrives.
func awaitResult(ctx context.Context, hc *http.Client, gw, ns, id string, out io.Writer) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result?wait=1m", gw, ns, id), nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		if resp.StatusCode == http.StatusOK {
			n, err := io.Copy(out, resp.Body)
			resp.Body.Close()
			if err != nil {
				return fmt.Errorf("result cut off after %d bytes: %w", n, err)
			}
			if resp.ContentLength >= 0 && n != resp.ContentLength {
				return fmt.Errorf("result cut off after %d of %d bytes", n, resp.ContentLength)
			}
			return nil
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err != nil {
			return err
		}
		switch resp.StatusCode {
		case http.StatusAccepted, http.StatusServiceUnavailable: // still running; the operator restarting
			select {
			case <-ctx.Done():
				return fmt.Errorf("no result yet: %w", ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		default:
			return apiError(resp.Status, body)
		}
	}
}

// streamEvents prints the session's progress events (server-sent events)
// as they arrive, with the time since the session started.
func streamEvents(ctx context.Context, hc *http.Client, gw, ns, id string, started time.Time, out io.Writer) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/events", gw, ns, id), nil)
	if err != nil {
		return
	}
	resp, err := hc.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var e sessions.Event
		if json.Unmarshal([]byte(data), &e) != nil || e.Kind == "Started" {
			continue
		}
		fmt.Fprintf(out, "  %8s  %-12s %s\n", fmtElapsed(e.Time.Sub(started)), e.Kind, e.Message)
	}
}

func fmtElapsed(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d < time.Second {
		return fmt.Sprintf("+%dms", d.Milliseconds())
	}
	return fmt.Sprintf("+%.2fs", d.Seconds())
}

// runSessions implements `ziptrail sessions [WORKFLOW]`: a table of the
// namespace's sessions, newest first.
func runSessions(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sessions", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var g gatewayFlags
	g.register(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return errors.New("usage: ziptrail sessions [WORKFLOW] [-n NAMESPACE]")
	}
	gw, err := g.url()
	if err != nil {
		return err
	}
	u := fmt.Sprintf("%s/v1/namespaces/%s/sessions", gw, g.namespace)
	if len(pos) == 1 {
		u += "?workflow=" + url.QueryEscape(pos[0])
	}
	hc, err := g.client()
	if err != nil {
		return err
	}
	var list []sessions.Session
	if err := call(ctx, hc, http.MethodGet, u, nil, 0, http.StatusOK, &list); err != nil {
		return err
	}
	if len(list) == 0 {
		fmt.Fprintf(stdout, "no sessions in namespace %s\n", g.namespace)
		return nil
	}
	sortSessions(list)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tWORKFLOW\tSTATE\tINVOCATIONS\tOBJECTS\tDURATION\tSTARTED")
	now := time.Now()
	for _, s := range list {
		end := now
		if s.Ended != nil {
			end = *s.Ended
		}
		state := string(s.State)
		if s.Error != "" {
			state += ": " + truncate(s.Error, 60)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s ago\n", s.ID, s.Workflow, state, s.Invocations, s.Objects,
			end.Sub(s.Started).Round(time.Millisecond), now.Sub(s.Started).Round(time.Second))
	}
	return tw.Flush()
}

// sortSessions orders sessions newest first.
func sortSessions(list []sessions.Session) {
	sort.SliceStable(list, func(i, j int) bool { return list[i].Started.After(list[j].Started) })
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// call does one JSON request (with a body of size bytes, when not nil) and
// decodes the answer into out.
func call(ctx context.Context, hc *http.Client, method, u string, body io.Reader, size int64, want int, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	if body != nil {
		req.ContentLength = size
		if size == 0 {
			req.Body = http.NoBody
		}
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("session gateway: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return apiError(resp.Status, data)
	}
	return json.Unmarshal(data, out)
}

// apiError turns the gateway's {"error": ...} answer into an error.
func apiError(status string, body []byte) error {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return errors.New(e.Error)
	}
	return fmt.Errorf("%s: %s", status, strings.TrimSpace(string(body)))
}
