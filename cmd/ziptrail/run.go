package main

import (
	"bufio"
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

	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/sessions"
)

// gatewayFlags are the flags of the commands that talk to a session gateway.
type gatewayFlags struct {
	gateway, namespace, stateDir string
}

func (g *gatewayFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.gateway, "gateway", os.Getenv("ZIPTRAIL_GATEWAY"), "session gateway URL (default: the running `ziptrail local up`'s, from its state dir)")
	fs.StringVar(&g.namespace, "n", "default", "namespace of the workflow")
	fs.StringVar(&g.stateDir, "state-dir", defaultStateDir(), "state dir of `ziptrail local up`")
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
	var data []byte
	switch *input {
	case "":
	case "-":
		data, err = io.ReadAll(stdin)
	default:
		data, err = os.ReadFile(*input)
	}
	if err != nil {
		return fmt.Errorf("read input: %w", err)
	}
	gw, err := g.url()
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
	if err := call(ctx, http.MethodPost, fmt.Sprintf("%s/v1/namespaces/%s/workflows/%s/sessions", gw, g.namespace, url.PathEscape(wf)),
		strings.NewReader(string(data)), http.StatusCreated, &s); err != nil {
		return fmt.Errorf("start a session of %s/%s: %w", g.namespace, wf, err)
	}
	fmt.Fprintf(progress, "==> session %s of %s/%s started (%d bytes of input)\n", s.ID, g.namespace, wf, len(data))

	// Progress streams while the result is awaited; the result request
	// returns when the session ends, and the stream then ends too.
	streamed := make(chan struct{})
	go func() {
		defer close(streamed)
		streamEvents(ctx, gw, g.namespace, s.ID, s.Started, progress)
	}()
	result, err := awaitResult(ctx, gw, g.namespace, s.ID)
	final := s
	if gerr := call(ctx, http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s", gw, g.namespace, s.ID), nil, http.StatusOK, &final); gerr == nil {
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
	fmt.Fprintf(progress, "==> %s%s: %d invocations, %d objects; result %d bytes\n", final.State, took, final.Invocations, final.Objects, len(result))
	if _, err := stdout.Write(result); err != nil {
		return err
	}
	if len(result) > 0 && result[len(result)-1] != '\n' {
		fmt.Fprintln(stdout)
	}
	return nil
}

// awaitResult long-polls the result until the session ends.
func awaitResult(ctx context.Context, gw, ns, id string) ([]byte, error) {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result?wait=1m", gw, ns, id), nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		switch resp.StatusCode {
		case http.StatusOK:
			return body, nil
		case http.StatusAccepted, http.StatusServiceUnavailable: // still running; the operator restarting
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("no result yet: %w", ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		default:
			return nil, apiError(resp.Status, body)
		}
	}
}

// streamEvents prints the session's progress events (server-sent events)
// as they arrive, with the time since the session started.
func streamEvents(ctx context.Context, gw, ns, id string, started time.Time, out io.Writer) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/events", gw, ns, id), nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
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
	var list []sessions.Session
	if err := call(ctx, http.MethodGet, u, nil, http.StatusOK, &list); err != nil {
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

// call does one JSON request and decodes the answer into out.
func call(ctx context.Context, method, u string, body io.Reader, want int, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("session gateway: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
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
