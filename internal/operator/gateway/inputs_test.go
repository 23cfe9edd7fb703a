package gateway_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestLargeInputByReference: an input over the inline threshold is not
// kept in the engine (nor in its checkpoints): the operator holds it in
// its input store, within a fixed budget, and the first function's
// sidecar pulls it by reference. Past the budget a start is refused with a
// clear 503; past the gateway's limit with 413; an input freed when its
// session ends; a reference forged in another namespace reads nothing.
func TestLargeInputByReference(t *testing.T) {
	var inputs *orchestrator.Inputs
	var inputsAddr string
	f := newFixture(t, func(f *fixture, o *orchestrator.Options) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		inputsAddr = ln.Addr().String()
		inputs = orchestrator.NewInputs(orchestrator.InputsOptions{Keys: f.keys, Addr: inputsAddr, Cap: 3 << 20})
		go func() { _ = inputs.Serve(ln) }()
		t.Cleanup(func() { _ = inputs.Close() })
		o.Inputs = inputs
	})
	f.namespace(t, "a")
	f.namespace(t, "b")
	token := f.serviceAccount(t, "a", "runner", "a")
	tokenB := f.serviceAccount(t, "b", "runner", "b")
	release := make(chan struct{})
	invoked := make(chan string, 8)
	// digest: "run" reads the input (through its sidecar) and sends its
	// digest on; "total" returns it. A re-execution rule covers "run", so
	// the engine keeps run's arguments (its input object) while it runs.
	digest := func(ns, wf string) {
		f.sidecar(t, ns, wf, "run", func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
			invoked <- inv.Session
			<-release
			sum := sha256.Sum256(inv.Objects[0].Bytes())
			return nil, ziptrail.SendObject(ctx, "digests", "d", []byte(hex.EncodeToString(sum[:])), nil)
		})
		f.fns.Add(t, wf+"-total", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
			return nil, ziptrail.SendObject(ctx, "output", "result", inv.Objects[0].Bytes(), nil)
		}))
		f.load(t, &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: wf}, Spec: v1alpha1.WorkflowSpec{
			Entry:     "run",
			Functions: []v1alpha1.FunctionSpec{{Name: "run", Image: "example.com/run"}, {Name: "total", Image: "example.com/total"}},
			Triggers: []v1alpha1.NamedTrigger{{Name: "collect", Spec: v1alpha1.TriggerSpec{Bucket: "digests", Primitive: v1alpha1.Immediate,
				Targets: []string{"total"}, Reexecution: []v1alpha1.ReexecutionRule{{SourceFunction: "run", Timeout: metav1.Duration{Duration: time.Hour}, MaxAttempts: 1}}}}},
		}})
	}
	digest("a", "digest")
	start := func(token, ns string, body io.Reader, size int64) (*http.Response, string) {
		wf := map[string]string{"a": "digest", "b": "digest-b"}[ns]
		req, _ := http.NewRequest(http.MethodPost, f.url+"/v1/namespaces/"+ns+"/workflows/"+wf+"/sessions", body)
		req.ContentLength = size
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	input := pattern(2 << 20)
	resp, body := start(token, "a", bytes.NewReader(input), int64(len(input)))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start with a 2 MiB input: %d %s", resp.StatusCode, body)
	}
	var s sessions.Session
	_ = json.Unmarshal([]byte(body), &s)
	<-invoked // the function runs: its sidecar has pulled the input

	// While it runs, the engine's state (what checkpoints save) holds a
	// reference, not the bytes.
	snap, err := json.Marshal(f.orch.Engine().Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap) > 64<<10 {
		t.Errorf("the engine's checkpoint state is %d bytes with a %d-byte input running: the input is kept inline", len(snap), len(input))
	}
	if inputs != nil && inputs.Used() != int64(len(input)) {
		t.Errorf("input store holds %d bytes, want %d", inputs.Used(), len(input))
	}

	// The budget (3 MiB) cannot take a second 2 MiB input now.
	resp, body = start(token, "a", bytes.NewReader(input), int64(len(input)))
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "reserved for") || resp.Header.Get("Retry-After") == "" {
		t.Errorf("second 2 MiB input over the budget: %d %s, want 503 saying the input memory is used, with Retry-After", resp.StatusCode, body)
	}
	// Over the gateway's limit: refused before reading.
	resp, body = start(token, "a", bytes.NewReader(make([]byte, maxInput+1)), maxInput+1)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, "exceeds") {
		t.Errorf("input over the limit: %d %s, want 413", resp.StatusCode, body)
	}
	// A large input of unannounced length is refused with the reason.
	resp, body = start(token, "a", io.MultiReader(bytes.NewReader(input)), -1)
	if resp.StatusCode != http.StatusLengthRequired || !strings.Contains(body, "Content-Length") {
		t.Errorf("chunked 2 MiB input: %d %s, want 411", resp.StatusCode, body)
	}

	// A sidecar of namespace b holds b's keys: it can seal a reference
	// naming a's input at the operator's input store, but reads nothing.
	digest("b", "digest-b")
	resp, body = start(tokenB, "b", bytes.NewReader(pattern(100_000)), 100_000)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start in b: %d %s", resp.StatusCode, body)
	}
	<-invoked
	kb, err := f.keys.Keys(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string][]byte{}
	for _, k := range kb.Keys {
		secrets[k.Id] = k.Secret
	}
	krB, err := ref.NewKeyring("b", secrets, kb.ActiveKeyId)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := krB.Seal(ref.Record{Addr: inputsAddr, Key: "a/" + s.ID + "/input", Expires: time.Now().Add(time.Hour), Reads: math.MaxUint32})
	pc := &pull.Client{Keys: krB}
	defer pc.Close()
	if data, _, err := pc.Pull(context.Background(), forged); !errors.Is(err, ref.ErrForeign) || len(data) != 0 {
		t.Errorf("b's forged reference to a's input: %d bytes, %v, want ErrForeign", len(data), err)
	}
	tampered := forged[:len(forged)-4] + "AAAA"
	if _, _, err := pc.Pull(context.Background(), tampered); !errors.Is(err, ref.ErrTampered) {
		t.Errorf("tampered reference: %v, want ErrTampered", err)
	}

	// The sessions complete with the digest of what the function read; the
	// inputs are then freed.
	close(release)
	resp, body = f.do(t, token, http.MethodGet, "/v1/namespaces/a/sessions/"+s.ID+"/result?wait=1m", nil)
	sum := sha256.Sum256(input)
	if resp.StatusCode != http.StatusOK || body != hex.EncodeToString(sum[:]) {
		t.Fatalf("result: %d %s, want the input's digest", resp.StatusCode, body)
	}
	if inputs != nil {
		waitFor(t, "the inputs to be freed", func() bool { return inputs.Used() == 0 })
	}
	// With the memory back, a 2 MiB input is taken again.
	resp, body = start(token, "a", bytes.NewReader(input), int64(len(input)))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("2 MiB input after the first ended: %d %s", resp.StatusCode, body)
	}
}
