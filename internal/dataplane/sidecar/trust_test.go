package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

func writeKeyFile(t *testing.T, fill byte) string {
	t.Helper()
	keyFile := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, 32))
	if err := os.WriteFile(keyFile, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return keyFile
}

// TestEnvelopeNamingAPathIsRefused: a caller (an attacker, or any client
// of the function's route) cannot hand the function a file: an envelope
// that names a path is refused before anything is resolved or forwarded.
func TestEnvelopeNamingAPathIsRefused(t *testing.T) {
	s := start(t, writeKeyFile(t, 6))
	var forwarded atomic.Int32
	fn := httptest.NewServer(s.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		forwarded.Add(1)
		w.Write([]byte("ran"))
	})))
	defer fn.Close()
	for name, obj := range map[string]invocation.Object{
		"absolute path":      {Bucket: "b", Key: "k", Path: "/etc/hostname"},
		"path with inline":   {Bucket: "b", Key: "k", Path: "/var/run/secrets/kubernetes.io/serviceaccount/token", Inline: []byte("x")},
		"path with ref":      {Bucket: "b", Key: "k", Path: "../../etc/passwd", Ref: "zt1.x"},
		"bare name in dir":   {Bucket: "b", Key: "k", Path: "in-00000000000000000000000000000000"},
		"relative traversal": {Bucket: "b", Key: "k", Path: "../objects/x"},
	} {
		resp, body := post(t, fn.URL, invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: "i",
			Objects: []invocation.Object{obj}})
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "path") {
			t.Errorf("%s: %d %q, want 400 naming the path", name, resp.StatusCode, body)
		}
	}
	if n := forwarded.Load(); n != 0 {
		t.Errorf("%d envelopes with paths reached the function", n)
	}
}

var inputName = regexp.MustCompile(`^in-[0-9a-f]{32}$`)

// TestResolvedInputsHaveUnguessableNames: the sidecar hands the function
// a bare, random file name inside the object directory (the only kind of
// path an SDK opens), never a path a caller could predict, and removes
// the file once the function answered.
func TestResolvedInputsHaveUnguessableNames(t *testing.T) {
	keyFile := writeKeyFile(t, 6)
	producer, consumer := start(t, keyFile), start(t, keyFile)
	big := bytes.Repeat([]byte("z"), 100_000)
	pfn := httptest.NewServer(producer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, _ := json.Marshal(invocation.Outputs{Objects: []invocation.Object{{Bucket: "b", Key: "big", Inline: big}}})
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		w.Write(out)
	})))
	defer pfn.Close()
	resp, body := post(t, pfn.URL, invocation.Envelope{Namespace: "ns", Function: "p", Session: "s", Invocation: "i1"})
	outs, err := invocation.DecodeOutputs(body)
	if resp.StatusCode != 200 || err != nil || outs.Objects[0].Ref == "" {
		t.Fatalf("producer: %d %v %s", resp.StatusCode, err, body)
	}

	var names []string
	cfn := httptest.NewServer(consumer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, err := invocation.Decode(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		for _, o := range env.Objects {
			names = append(names, o.Path)
			got, err := os.ReadFile(filepath.Join(consumer.cfg.ShmDir, o.Path))
			if err != nil || !bytes.Equal(got, big) {
				http.Error(w, "input not in the object directory", 500)
				return
			}
		}
		w.Write([]byte("ok"))
	})))
	defer cfn.Close()
	ref := outs.Objects[0].Ref
	resp, body = post(t, cfn.URL, invocation.Envelope{Namespace: "ns", Function: "c", Session: "s", Invocation: "i2",
		Objects: []invocation.Object{{Bucket: "b", Key: "x", Ref: ref}, {Bucket: "b", Key: "y", Ref: ref}}})
	if resp.StatusCode != 200 {
		t.Fatalf("consumer: %d %s", resp.StatusCode, body)
	}
	if len(names) != 2 || !inputName.MatchString(names[0]) || !inputName.MatchString(names[1]) || names[0] == names[1] {
		t.Fatalf("input paths %q: want two distinct bare names in-<32 hex>", names)
	}
	if left, _ := os.ReadDir(consumer.cfg.ShmDir); len(left) != 0 {
		t.Errorf("left in the object directory after the invocation: %v", left)
	}
}

// TestPlainResponsesAreStreamed: a response without objects passes
// through as the function writes it; the sidecar does not hold it in
// memory until the function is done (a 10 GB download would otherwise
// need 10 GB in the sidecar).
func TestPlainResponsesAreStreamed(t *testing.T) {
	s := start(t, writeKeyFile(t, 6))
	firstRead := make(chan struct{})
	fn := httptest.NewServer(s.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte("a"), 1<<20))
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		select {
		case <-firstRead:
			w.Write([]byte("end"))
		case <-time.After(20 * time.Second): // bound of a failing test, not a timing assertion
			w.Write([]byte("the caller saw nothing before the function finished"))
		}
	})))
	defer fn.Close()
	data, _ := json.Marshal(invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: "i"})
	resp, err := http.Post(fn.URL, invocation.ContentType, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(resp.Body, head); err != nil {
		t.Fatal(err)
	}
	close(firstRead)
	rest, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(rest) != "end" {
		t.Fatalf("%d, tail %q", resp.StatusCode, rest)
	}
}

// TestOversizedOutputsAreRefused: a function whose response with objects
// exceeds the cap gets a clear error instead of growing the sidecar's
// heap; the sidecar stops reading it (behind a real reverse proxy, as in
// queue-proxy) and stores nothing.
func TestOversizedOutputsAreRefused(t *testing.T) {
	s := start(t, writeKeyFile(t, 6))
	user := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		bw := bufio.NewWriter(w)
		bw.WriteString(`{"objects":[{"bucket":"b","key":"k","inline":"`)
		chunk := bytes.Repeat([]byte("A"), 1<<20)
		for range invocation.MaxEnvelopeBytes>>20 + 1 {
			if _, err := bw.Write(chunk); err != nil {
				return // the sidecar hung up: expected
			}
		}
		bw.WriteString(`"}]}`)
		bw.Flush()
	}))
	defer user.Close()
	target, _ := url.Parse(user.URL)
	proxy := httptest.NewServer(s.Wrap(httputil.NewSingleHostReverseProxy(target)))
	defer proxy.Close()
	resp, body := post(t, proxy.URL, invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: "i"})
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "exceed") {
		t.Fatalf("%d %.200q, want 502 saying the outputs exceed the cap", resp.StatusCode, body)
	}
	if s.Store.Len() != 0 {
		t.Errorf("%d objects stored from refused outputs", s.Store.Len())
	}
}

// TestOutputsWaitForMemory: responses with objects being rewritten share
// a memory budget (the pod's object memory cap, here equal to one
// response's cap): while one holds most of it, another waits (here: until
// the put timeout, then a clear "store full"), and the first completes.
func TestOutputsWaitForMemory(t *testing.T) {
	s := New(Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(),
		MemoryLimit: 4 << 20, MaxOutputsBytes: 4 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute, KeyFile: writeKeyFile(t, 6),
		PutTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	body := func(key string) []byte {
		out, _ := json.Marshal(invocation.Outputs{Objects: []invocation.Object{{Bucket: "b", Key: key, Inline: bytes.Repeat([]byte("q"), 2<<20)}}})
		return out
	}
	holding, release := make(chan struct{}), make(chan struct{})
	fn := httptest.NewServer(s.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, _ := invocation.Decode(r.Body)
		out := body(env.Invocation)
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		w.WriteHeader(200)
		if env.Invocation == "first" {
			w.Write(out[:1000])
			close(holding)
			<-release
			w.Write(out[1000:])
			return
		}
		w.Write(out)
	})))
	defer fn.Close()
	first := make(chan int, 1)
	go func() {
		data, _ := json.Marshal(invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: "first"})
		resp, err := http.Post(fn.URL, invocation.ContentType, bytes.NewReader(data))
		if err != nil {
			first <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-holding
	resp, b := post(t, fn.URL, invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: "second"})
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(b), "store full") {
		t.Errorf("second response while the first holds the memory: %d %q, want 507 store full", resp.StatusCode, b)
	}
	close(release)
	if code := <-first; code != 200 {
		t.Errorf("first response: %d", code)
	}
}
