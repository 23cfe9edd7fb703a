package ziptrail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

func post(t *testing.T, url string, env any) (int, string) {
	t.Helper()
	data, _ := json.Marshal(env)
	resp, err := http.Post(url, invocation.ContentType, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestFunctionHandler(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("ZIPTRAIL_SHM_DIR", dir)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB, mapped
	bigName := invocation.NewInputName()                   // as the sidecar names a pulled input
	if err := os.WriteFile(filepath.Join(dir, bigName), big, 0o600); err != nil {
		t.Fatal(err)
	}
	var seen *Invocation
	srv := httptest.NewServer(FunctionHandler(func(ctx context.Context, inv *Invocation) ([]byte, error) {
		if cur, ok := CurrentInvocation(ctx); !ok || cur != inv {
			return nil, errors.New("context does not carry the invocation")
		}
		if string(inv.Args) == "fail" {
			return nil, errors.New("the handler failed")
		}
		seen = inv
		b := inv.Object("chunks", "big").Bytes()
		return []byte(string(inv.Object("chunks", "small").Bytes()) + ":" + string(b[len(b)-4:])), nil
	}))
	defer srv.Close()

	env := invocation.Envelope{Namespace: "ns", Function: "map", Session: "s", Invocation: "i", Group: "g1",
		Objects: []invocation.Object{
			{Bucket: "chunks", Key: "small", Size: 2, Inline: []byte("hi")},
			{Bucket: "chunks", Key: "big", Size: int64(len(big)), Path: bigName, Ref: "zt1.x"},
		}}
	code, body := post(t, srv.URL, env)
	if code != 200 || body != "hi:cdef" {
		t.Fatalf("%d %q", code, body)
	}
	if seen.Group != "g1" || seen.Objects[1].Size != int64(len(big)) || seen.Objects[1].mapped {
		t.Errorf("invocation %+v (mapped inputs must be unmapped after the handler)", seen)
	}

	for name, tc := range map[string]struct {
		env  any
		code int
		msg  string
	}{
		"malformed":     {map[string]any{"session": 1}, 400, "malformed envelope"},
		"handler error": {invocation.Envelope{Function: "f", Session: "s", Invocation: "i", Args: []byte("fail")}, 500, "the handler failed"},
		"missing file": {invocation.Envelope{Function: "f", Session: "s", Invocation: "i",
			Objects: []invocation.Object{{Bucket: "b", Key: "k", Path: invocation.NewInputName()}}}, 400, "no such file"},
		"unresolved ref": {invocation.Envelope{Function: "f", Session: "s", Invocation: "i",
			Objects: []invocation.Object{{Bucket: "b", Key: "k", Ref: "zt1.x"}}}, 400, "unresolved"},
		"attempt not a number": {map[string]any{"function": "f", "session": "s", "invocation": "i", "attempt": "x"}, 400, "attempt"},
		"objects not a list":   {map[string]any{"function": "f", "session": "s", "invocation": "i", "objects": "x"}, 400, "objects"},
		"object not a dict":    {map[string]any{"function": "f", "session": "s", "invocation": "i", "objects": []any{1}}, 400, "Object"},
		"size not a number": {map[string]any{"function": "f", "session": "s", "invocation": "i",
			"objects": []any{map[string]any{"bucket": "b", "key": "k", "size": "x", "inline": "eA=="}}}, 400, "size"},
		"invalid base64": {map[string]any{"function": "f", "session": "s", "invocation": "i",
			"objects": []any{map[string]any{"bucket": "b", "key": "k", "inline": "not base64!"}}}, 400, "base64"},
	} {
		code, body := post(t, srv.URL, tc.env)
		if code != tc.code || !strings.Contains(body, tc.msg) {
			t.Errorf("%s: %d %q, want %d containing %q", name, code, body, tc.code, tc.msg)
		}
	}
}

func TestErrorKinds(t *testing.T) {
	err := &Error{Kind: KindExpired, Op: "get", Err: errors.New("ref expired at 12:00")}
	if !IsKind(err, KindExpired) || IsKind(err, KindExhausted) {
		t.Error("IsKind")
	}
	if !errors.Is(err, &Error{Kind: KindExpired}) {
		t.Error("errors.Is by kind")
	}
	if !strings.Contains(err.Error(), "Expired") || !strings.Contains(err.Error(), "12:00") {
		t.Errorf("message %q", err)
	}
}

func TestSendObject(t *testing.T) {
	srv := httptest.NewServer(FunctionHandler(func(ctx context.Context, inv *Invocation) ([]byte, error) {
		if err := SendObject(ctx, "shuffle", "w-a", []byte("1"), map[string]string{"group": "a"}); err != nil {
			return nil, err
		}
		return []byte("done"), nil
	}))
	defer srv.Close()
	data, _ := json.Marshal(invocation.Envelope{Function: "map", Session: "s", Invocation: "i"})
	resp, err := http.Post(srv.URL, invocation.ContentType, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("Content-Type") != invocation.OutputsContentType {
		t.Fatalf("content type %q: %s", resp.Header.Get("Content-Type"), body)
	}
	outs, err := invocation.DecodeOutputs(body)
	if err != nil {
		t.Fatal(err)
	}
	if string(outs.Return) != "done" || len(outs.Objects) != 1 || outs.Objects[0].Metadata["group"] != "a" || string(outs.Objects[0].Inline) != "1" {
		t.Errorf("outputs %+v", outs)
	}
	if err := SendObject(context.Background(), "b", "k", nil, nil); !IsKind(err, KindNotFound) {
		t.Errorf("outside a handler: %v", err)
	}
}
