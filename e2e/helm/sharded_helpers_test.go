package helm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// What the sharded engine's spec (sharded_test.go) reads of the cluster
// (bucket Leases, status.engine), its gateway client, and its workflows.
// bucketLeases are the Leases of the engine's buckets, by name.
func bucketLeases(g Gomega) map[string]string {
	list, err := cs.CoordinationV1().Leases(releaseNS).List(ctx, metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	holders := map[string]string{}
	for _, l := range list.Items {
		if strings.HasPrefix(l.Name, "ziptrail-engine.") && strings.HasSuffix(l.Name, fmt.Sprintf("-of-%02d", engineBuckets)) {
			h := ""
			if l.Spec.HolderIdentity != nil && l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < engineLease {
				h = *l.Spec.HolderIdentity
			}
			holders[l.Name] = h
		}
	}
	return holders
}

// engineLeaseNames lists every Lease of the sharded engine left in
// releaseNS: buckets and replica announcements.
func engineLeaseNames() []string {
	list, err := cs.CoordinationV1().Leases(releaseNS).List(ctx, metav1.ListOptions{})
	Expect(err).NotTo(HaveOccurred())
	var names []string
	for _, l := range list.Items {
		if strings.HasPrefix(l.Name, "ziptrail-engine.") || l.Name == leaseName {
			names = append(names, l.Name)
		}
	}
	return names
}

// spread checks that every live operator pod holds its share of the
// buckets (2 of 6 for 3 replicas); it returns the pods by IP.
func spread(g Gomega, replicas int) map[string]corev1.Pod {
	byIP := map[string]corev1.Pod{}
	for _, p := range operatorPods() {
		if p.DeletionTimestamp == nil && podReady(p) {
			byIP[p.Status.PodIP] = p
		}
	}
	g.Expect(byIP).To(HaveLen(replicas), "Ready operator pods")
	held := map[string]int{}
	for name, h := range bucketLeases(g) {
		g.Expect(byIP).To(HaveKey(h), "Lease %s held by a live operator pod", name)
		held[h]++
	}
	g.Expect(held).To(HaveLen(replicas))
	for ip, n := range held {
		g.Expect(n).To(Equal(engineBuckets/replicas), "buckets held by %s (%s)", ip, byIP[ip].Name)
	}
	return byIP
}

// engineOf is a Workflow's status.engine, once its owner wrote it.
func engineOf(g Gomega, name string) v1alpha1.WorkflowEngine {
	wf := &v1alpha1.Workflow{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: wfNS, Name: name}, wf)).To(Succeed())
	g.Expect(wf.Status.Engine).NotTo(BeNil(), "status.engine of %s", name)
	return *wf.Status.Engine
}

// gw is the gateway as a client that retries sees it through the Service:
// while a replica is dead the Service may still send a call there.
type gw struct{ base, token string }

var errRetry = errors.New("retry")

func (g gw) call(method, path, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, method, g.base+path, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+g.token)
	c := http.Client{Timeout: 2 * time.Minute}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("%w: %v", errRetry, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", fmt.Errorf("%w: %v", errRetry, err)
	}
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout,
		http.StatusTooManyRequests: // a per-namespace limit: Retry-After says when
		return resp.StatusCode, string(data), fmt.Errorf("%w: %d %s", errRetry, resp.StatusCode, data)
	}
	return resp.StatusCode, string(data), nil
}

// retrying repeats call while it says retry, for at most a minute; it
// counts the retries.
func (g gw) retrying(retries *int, method, path, body string) (int, string, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		code, data, err := g.call(method, path, body)
		if !errors.Is(err, errRetry) || time.Now().After(deadline) {
			return code, data, err
		}
		*retries++
		time.Sleep(100 * time.Millisecond)
	}
}

// session starts a session and waits for its result, which must be want.
func (g gw) session(wf, input, want string, retries *int) error {
	code, body, err := g.retrying(retries, http.MethodPost, fmt.Sprintf("/v1/namespaces/%s/workflows/%s/sessions", wfNS, wf), input)
	if err != nil || code != http.StatusCreated {
		return fmt.Errorf("start %s: %d %s %v", wf, code, body, err)
	}
	var s sessions.Session
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		return err
	}
	code, body, err = g.retrying(retries, http.MethodGet, fmt.Sprintf("/v1/namespaces/%s/sessions/%s/result?wait=1m", wfNS, s.ID), "")
	if err != nil || code != http.StatusOK || body != want {
		return fmt.Errorf("session %s: result %d %q (want %q) %v", s.ID, code, body, want, err)
	}
	return nil
}

// echoWorkflow returns its input as the session's result (one warm pod).
func echoWorkflow() v1alpha1.WorkflowSpec {
	one := int32(1)
	f := pyFunction("echo", "", `
def handle(inv):
    ziptrail.send_object("output", "result", inv.objects[0].bytes())
    return b""`)
	f.MinScale = &one
	return v1alpha1.WorkflowSpec{Entry: "echo", Functions: []v1alpha1.FunctionSpec{f}, Buckets: []v1alpha1.NamedBucket{{Name: "output"}}}
}

// pyGate records each run of a function in the gate directory and lets the
// first run of c wait there until the spec writes <gate>/release.
const pyGate = `
import os, tempfile, time
def record_run(name):
    os.close(tempfile.mkstemp(prefix=name + "-run-", dir=GATE)[0])
def first_run(name):
    try:
        os.close(os.open(os.path.join(GATE, name + "-first"), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False
def wait_for(path, limit=600):
    deadline = time.time() + limit
    while not os.path.exists(path):
        if time.time() > deadline:
            raise RuntimeError("gave up waiting for " + path)
        time.sleep(0.02)
`

// faninWorkflow: split sends the input to a, b and c (Immediate), each adds
// its name to a part, and a BySet trigger joins the three parts. c's first
// run waits for the gate; a run whose output is lost is re-executed after
// 20 s (once).
func faninWorkflow(gate string) v1alpha1.WorkflowSpec {
	one := int32(1)
	fn := func(name, body string) v1alpha1.FunctionSpec {
		f := pyFunction(name, fmt.Sprintf("GATE = %q\n", gate)+pyGate, body)
		f.MinScale = &one
		return f
	}
	fns := []v1alpha1.FunctionSpec{fn("split", `
def handle(inv):
    for b in ("to-a", "to-b", "to-c"):
        ziptrail.send_object(b, "x", inv.objects[0].bytes())
    return b""`)}
	for _, p := range []string{"a", "b", "c"} {
		fns = append(fns, fn(p, fmt.Sprintf(`
def handle(inv):
    record_run(%[1]q)
    if %[1]q == "c" and first_run("c"):
        wait_for(os.path.join(GATE, "release"))
    ziptrail.send_object("parts", %[1]q, inv.objects[0].bytes() + b"|" + %[1]q.encode())
    return b""`, p)))
	}
	fns = append(fns, fn("join", `
def handle(inv):
    record_run("join")
    ziptrail.send_object("output", "result", " + ".join(sorted(o.bytes().decode() for o in inv.objects)))
    return b""`))
	imm := func(bucket, target string) v1alpha1.NamedTrigger {
		return v1alpha1.NamedTrigger{Name: bucket, Spec: v1alpha1.TriggerSpec{Bucket: bucket, Primitive: v1alpha1.Immediate, Targets: []string{target}}}
	}
	var buckets []v1alpha1.NamedBucket
	for _, b := range []string{"to-a", "to-b", "to-c", "parts", "output"} {
		buckets = append(buckets, v1alpha1.NamedBucket{Name: b})
	}
	return v1alpha1.WorkflowSpec{Entry: "split", Functions: fns, Buckets: buckets,
		Triggers: []v1alpha1.NamedTrigger{imm("to-a", "a"), imm("to-b", "b"), imm("to-c", "c"),
			{Name: "join", Spec: v1alpha1.TriggerSpec{Bucket: "parts", Primitive: v1alpha1.BySet,
				BySet: &v1alpha1.BySetParams{Keys: []string{"a", "b", "c"}}, Targets: []string{"join"},
				Reexecution: []v1alpha1.ReexecutionRule{{SourceFunction: "c", Timeout: metav1.Duration{Duration: 20 * time.Second}, MaxAttempts: 2}}}}},
	}
}

func runsOf(gate, name string) int {
	m, err := filepath.Glob(filepath.Join(gate, name+"-run-*"))
	Expect(err).NotTo(HaveOccurred())
	return len(m)
}
