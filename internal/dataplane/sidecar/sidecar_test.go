package sidecar

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// start runs a sidecar with a key file, as in standalone mode.
func start(t *testing.T, keyFile string) *Sidecar {
	s := New(Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(),
		MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute, KeyFile: keyFile})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func post(t *testing.T, url string, env invocation.Envelope) (*http.Response, []byte) {
	data, _ := json.Marshal(env)
	resp, err := http.Post(url, invocation.ContentType, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestObjectsTravelByReferenceBetweenPods(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32))
	if err := os.WriteFile(keyFile, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	producer, consumer := start(t, keyFile), start(t, keyFile)
	big := bytes.Repeat([]byte("0123456789"), 100_000) // 1 MB

	// The producer function returns a large object and a small one.
	pfn := httptest.NewServer(producer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, _ := json.Marshal(invocation.Outputs{Objects: []invocation.Object{
			{Bucket: "b", Key: "big", Inline: big}, {Bucket: "b", Key: "small", Inline: []byte("tiny")}}})
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		w.Write(out)
	})))
	defer pfn.Close()
	resp, body := post(t, pfn.URL, invocation.Envelope{Namespace: "ns", Function: "p", Session: "s1", Invocation: "i1"})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	outs, err := invocation.DecodeOutputs(body)
	if err != nil {
		t.Fatal(err)
	}
	bigOut, small := outs.Objects[0], outs.Objects[1]
	if bigOut.Ref == "" || bigOut.Inline != nil || bigOut.Size != int64(len(big)) || strings.Contains(string(body), "0123456789") {
		t.Fatalf("the large object left the pod: %+v", bigOut)
	}
	if small.Ref != "" || string(small.Inline) != "tiny" {
		t.Errorf("the small object should stay inline: %+v", small)
	}
	if producer.Store.Len() != 1 {
		t.Errorf("producer store holds %d objects", producer.Store.Len())
	}

	// The consumer's function receives it resolved into a file.
	var gotPath string
	var got []byte
	cfn := httptest.NewServer(consumer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, err := invocation.Decode(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		gotPath = filepath.Join(consumer.cfg.ShmDir, env.Objects[0].Path)
		got, _ = os.ReadFile(gotPath)
		w.Write([]byte("ok"))
	})))
	defer cfn.Close()
	resp, body = post(t, cfn.URL, invocation.Envelope{Namespace: "ns", Function: "c", Session: "s1", Invocation: "i2",
		Objects: []invocation.Object{{Bucket: "b", Key: "big", Ref: bigOut.Ref, Size: bigOut.Size}}})
	if resp.StatusCode != 200 || !bytes.Equal(got, big) {
		t.Fatalf("%d %s: got %d bytes", resp.StatusCode, body, len(got))
	}
	if _, err := os.Stat(gotPath); !os.IsNotExist(err) {
		t.Errorf("resolved input %s left behind after the invocation", gotPath)
	}

	// A tampered reference fails the invocation with its class named.
	bad := []byte(bigOut.Ref)
	if bad[len(bad)-5] == 'A' { // another valid base64url character
		bad[len(bad)-5] = 'B'
	} else {
		bad[len(bad)-5] = 'A'
	}
	resp, body = post(t, cfn.URL, invocation.Envelope{Namespace: "ns", Function: "c", Session: "s1", Invocation: "i3",
		Objects: []invocation.Object{{Bucket: "b", Key: "big", Ref: string(bad)}}})
	if resp.StatusCode != http.StatusFailedDependency || !strings.Contains(string(body), "tampered") {
		t.Errorf("tampered: %d %s", resp.StatusCode, body)
	}

	// Session GC frees the producer's memory (once the consumer's reader
	// release, an asynchronous Cap'n Proto message, has arrived).
	if n := producer.Store.DropSession("s1"); n != 1 {
		t.Errorf("dropped %d objects", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for producer.Store.Used() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if u := producer.Store.Used(); u != 0 {
		t.Errorf("%d bytes still held after session GC", u)
	}

	// A stock request passes through untouched.
	plain := httptest.NewServer(consumer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(append([]byte("echo:"), b...))
	})))
	defer plain.Close()
	r2, err := http.Post(plain.URL, "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if string(b) != "echo:hello" {
		t.Errorf("stock request: %q", b)
	}
}
