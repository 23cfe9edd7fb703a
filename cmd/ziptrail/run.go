package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/retry"
)

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
	output := fs.String("o", "", "write the result to this file instead of stdout: its bytes exactly, the file complete or not there at all")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up waiting for the result after this long")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: ziptrail run WORKFLOW [--input FILE|-] [-n NAMESPACE] [-q] [-o FILE]")
	}
	wf := pos[0]
	// The result goes to a temporary file next to -o's, renamed once it
	// is whole: a failed or cut session leaves no partial result behind.
	dst := stdout
	var out *os.File
	if *output != "" {
		if out, err = os.CreateTemp(filepath.Dir(*output), "."+filepath.Base(*output)+".*.partial"); err != nil {
			return fmt.Errorf("result file: %w", err)
		}
		defer func() {
			if out != nil {
				out.Close()
				os.Remove(out.Name())
			}
		}()
		dst = out
	}
	body, size, closeInput, err := openInput(*input, stdin)
	if err != nil {
		return fmt.Errorf("read input: %w", err)
	}
	defer closeInput()
	gw, err := g.url()
	if err != nil {
		return err
	}
	hc, err := g.client(stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	progress := stderr
	if *quiet {
		progress = io.Discard
	}

	// The start carries an idempotency key: retried after its answer was
	// lost (the connection broke once the request was out), it answers
	// the session it started rather than a second one.
	var key [16]byte
	_, _ = rand.Read(key[:])
	var s sessions.Session
	if err := hc.call(ctx, http.MethodPost, fmt.Sprintf("%s/v1/namespaces/%s/workflows/%s/sessions", gw, g.namespace, url.PathEscape(wf)),
		body, size, http.Header{gateway.IdempotencyKeyHeader: {hex.EncodeToString(key[:])}}, http.StatusCreated, &s); err != nil {
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
	// The result streams to stdout (or -o's file) as it arrives, whatever
	// its size.
	res := &lastByte{w: dst}
	err = awaitResult(ctx, hc, gw, g.namespace, s.ID, res)
	final := s
	if gerr := hc.call(ctx, http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s", gw, g.namespace, s.ID), nil, 0, nil, http.StatusOK, &final); gerr == nil {
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
	if out != nil {
		err := out.Sync()
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(out.Name(), *output)
		}
		if err != nil {
			return fmt.Errorf("result file: %w", err)
		}
		out = nil
		fmt.Fprintf(progress, "==> result written to %s\n", *output)
	}
	fmt.Fprintf(progress, "==> %s%s: %d invocations, %d objects; result %d bytes\n", final.State, took, final.Invocations, final.Objects, res.n)
	// The result's bytes are the result's: a newline is added only to end
	// the line on a terminal, never into a pipe or a file.
	if dst == stdout && res.n > 0 && res.last != '\n' && isTerminal(stdout) {
		fmt.Fprintln(stdout)
	}
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// openInput opens the session input: a file (streamed, its length known),
// stdin (read whole unless it is a file), or nothing; it can be sent again
// (a retried start).
func openInput(name string, stdin io.Reader) (io.ReadSeeker, int64, func(), error) {
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
// to out as it arrives. A result whose transfer breaks is read again (it
// stays readable until acknowledged) and written on from where it broke;
// read whole, it is acknowledged.
func awaitResult(ctx context.Context, hc *gwClient, gw, ns, id string, out io.Writer) error {
	u := fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result", gw, ns, id)
	var written int64 // bytes of the result written to out
	b := hc.backoff()
	for {
		resp, err := hc.do(ctx, func() (*http.Request, error) {
			return http.NewRequestWithContext(ctx, http.MethodGet, u+"?wait=1m", nil)
		})
		if err != nil {
			return err
		}
		if resp.StatusCode == http.StatusOK {
			cut, err := copyResult(out, resp, &written)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if cut == nil {
				hc.ack(ctx, u)
				return nil
			}
			pause, ok := b.Next(0)
			if !ok || ctx.Err() != nil {
				return fmt.Errorf("result cut off after %d bytes: %w", written, cut)
			}
			fmt.Fprintf(hc.notices, "result cut off after %d bytes (%v), reading the rest in %s…\n", written, cut, fmtPause(pause))
			if retry.Sleep(ctx, pause) != nil {
				return fmt.Errorf("result cut off after %d bytes: %w", written, cut)
			}
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusAccepted { // 202: still running
			return apiError(resp.Status, body)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no result yet: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// copyResult writes a result's body to out, skipping the *written bytes
// an earlier, broken transfer wrote already. cut says why the transfer
// ended short (nil: the result is whole); err is a failure to write out.
func copyResult(out io.Writer, resp *http.Response, written *int64) (cut, err error) {
	if resp.ContentLength >= 0 && resp.ContentLength < *written {
		return nil, fmt.Errorf("the result is %d bytes, %d were written already", resp.ContentLength, *written)
	}
	if _, cut = io.CopyN(io.Discard, resp.Body, *written); cut != nil {
		return cut, nil
	}
	w := &errWriter{w: out}
	n, cerr := io.Copy(w, resp.Body)
	*written += n
	switch {
	case w.err != nil:
		return nil, w.err
	case cerr != nil:
		return cerr, nil
	case resp.ContentLength >= 0 && *written != resp.ContentLength:
		return fmt.Errorf("%d of %d bytes", *written, resp.ContentLength), nil
	}
	return nil, nil
}

// errWriter tells a failure to write from one to read.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

// streamEvents prints the session's progress events (server-sent events)
// as they arrive, with the time since the session started.
func streamEvents(ctx context.Context, hc *gwClient, gw, ns, id string, started time.Time, out io.Writer) {
	var last time.Time // of the last event printed
	b := hc.backoff()
	for {
		// A stream that breaks before the session ended (an operator
		// rollout) is opened again, quietly, printing only newer events.
		if streamOnce(ctx, hc, gw, ns, id, started, out, &last) || ctx.Err() != nil {
			return
		}
		pause, ok := b.Next(0)
		if !ok || retry.Sleep(ctx, pause) != nil {
			return
		}
	}
}

// streamOnce prints the events one stream brings that are newer than
// *last; done: the session ended, or its events cannot be streamed.
func streamOnce(ctx context.Context, hc *gwClient, gw, ns, id string, started time.Time, out io.Writer, last *time.Time) (done bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/events", gw, ns, id), nil)
	if err != nil {
		return true
	}
	resp, err := hc.hc.Do(req)
	if err != nil {
		return !retryable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode != http.StatusServiceUnavailable
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var e sessions.Event
		if json.Unmarshal([]byte(data), &e) != nil || !e.Time.After(*last) {
			continue
		}
		*last = e.Time
		switch sessions.State(e.Kind) {
		case sessions.Completed, sessions.Failed, sessions.Expired:
			done = true
		}
		if e.Kind != "Started" {
			fmt.Fprintf(out, "  %8s  %-12s %s\n", fmtElapsed(e.Time.Sub(started)), e.Kind, e.Message)
		}
	}
	return done
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
	hc, err := g.client(stderr)
	if err != nil {
		return err
	}
	var list []sessions.Session
	if err := hc.call(ctx, http.MethodGet, u, nil, 0, nil, http.StatusOK, &list); err != nil {
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

// gwClient sends requests to the gateway, retrying those that could not
// reach it or that it answered 503 (an operator rollout, its engine moving
// between replicas, its input store full) with back-off within retryFor,
// saying so on notices.
type gwClient struct {
	hc       *http.Client
	retryFor time.Duration // 0: no retries
	notices  io.Writer
}

func (c *gwClient) backoff() *retry.Backoff {
	if c.retryFor <= 0 {
		return &retry.Backoff{For: -1}
	}
	return &retry.Backoff{For: c.retryFor}
}

// do sends the request newReq makes, again while the gateway cannot be
// reached or answers 503 (honouring its Retry-After), within the retry
// budget. newReq must make a request that may be sent again.
func (c *gwClient) do(ctx context.Context, newReq func() (*http.Request, error)) (*http.Response, error) {
	b := c.backoff()
	for {
		req, err := newReq()
		if err != nil {
			return nil, err
		}
		resp, err := c.hc.Do(req)
		var why string
		var after time.Duration
		switch {
		case err != nil && (ctx.Err() != nil || !retryable(err)):
			return nil, fmt.Errorf("session gateway: %w", err)
		case err != nil:
			why = "unreachable (" + cause(err) + ")"
		case resp.StatusCode == http.StatusServiceUnavailable:
			after = retry.RetryAfter(resp.Header, time.Now())
			why = "unavailable (503)"
		default:
			return resp, nil
		}
		pause, ok := b.Next(after)
		if !ok {
			if err != nil {
				return nil, fmt.Errorf("session gateway: %w", err)
			}
			return resp, nil // the caller reports the 503
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		fmt.Fprintf(c.notices, "gateway %s, retrying in %s…\n", why, fmtPause(pause))
		if serr := retry.Sleep(ctx, pause); serr != nil {
			if err == nil {
				err = errors.New("503 Service Unavailable")
			}
			return nil, fmt.Errorf("session gateway: %w (%w)", err, serr)
		}
	}
}

// retryable: the request may not have reached the gateway, or its answer
// was lost (refused, reset, closed before an answer); not a failure to
// verify the gateway's certificate.
func retryable(err error) bool {
	var cert *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	return !errors.As(err, &cert) && !errors.As(err, &unknown) && !errors.As(err, &host)
}

// cause is the innermost part of a request's error ("connect: connection
// refused").
func cause(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Op + ": " + op.Err.Error()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

func fmtPause(d time.Duration) string {
	if d < time.Second {
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// ack acknowledges a result read whole, once and without retrying: the
// gateway frees it after its grace anyway.
func (c *gwClient) ack(ctx context.Context, resultURL string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, resultURL, nil)
	if err != nil {
		return
	}
	if resp, err := c.hc.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}
}

// call does one JSON request (with a body of size bytes, when not nil,
// sent again from its start on a retry) and decodes the answer into out.
func (c *gwClient) call(ctx context.Context, method, u string, body io.ReadSeeker, size int64, header http.Header, want int, out any) error {
	var start int64
	if body != nil {
		var err error
		if start, err = body.Seek(0, io.SeekCurrent); err != nil {
			return err
		}
	}
	resp, err := c.do(ctx, func() (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, method, u, nil)
		if err != nil {
			return nil, err
		}
		for k, v := range header {
			req.Header[k] = v
		}
		if body != nil {
			if _, err := body.Seek(start, io.SeekStart); err != nil {
				return nil, err
			}
			req.ContentLength = size
			req.Body = http.NoBody
			if size != 0 {
				req.Body = io.NopCloser(body) // not closed: a retry sends it again
			}
			req.Header.Set("Content-Type", "application/octet-stream")
		}
		return req, nil
	})
	if err != nil {
		return err
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
