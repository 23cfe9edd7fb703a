package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// pythonImage is the image catalog's generic Python (config/local/images.yaml):
// python3 in the repository root with the SDK on PYTHONPATH.
const pythonImage = "ghcr.io/ziptrail/python:3"

// pyFunction runs a Python handler with the repository's SDK.
func pyFunction(name, body string) v1alpha1.FunctionSpec {
	src := "import ziptrail\n" + body + "\nziptrail.serve(handle)\n"
	return v1alpha1.FunctionSpec{Name: name, Image: pythonImage, Command: []string{"python3", "-c", src}}
}

// gatewayURL is the session gateway of the target.
func gatewayURL() string {
	if cluster != nil {
		return cluster.GatewayURL
	}
	return "http://" + envOr("E2E_GATEWAY", "127.0.0.1:8088")
}

// gw is the session gateway's HTTP client: it sends a bearer token the
// gateway accepts.
var gw = &http.Client{Transport: bearer{}}

type bearer struct{}

func (bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+gatewayToken())
	return http.DefaultTransport.RoundTrip(r)
}

var (
	tokenOnce sync.Once
	token     string
)

// gatewayToken is the local cluster's admin token; on another cluster, a
// token of a ServiceAccount bound to the chart's ziptrail-session-runner
// ClusterRole in every namespace.
func gatewayToken() string {
	if cluster != nil {
		return cluster.GatewayToken
	}
	tokenOnce.Do(func() {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "e2e-gateway"}}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, sa))).To(Succeed())
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-gateway"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ziptrail-session-runner"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: "e2e-gateway"}}}))).To(Succeed())
		tr := &authv1.TokenRequest{}
		Expect(k8s.SubResource("token").Create(ctx, sa, tr)).To(Succeed())
		token = tr.Status.Token
	})
	return token
}

func waitWorkflowReady(wf *v1alpha1.Workflow) {
	Eventually(func(g Gomega) {
		got := &v1alpha1.Workflow{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), got)).To(Succeed())
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady)).To(BeTrue(), "%v", got.Status.Conditions)
	}).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
}

// runSession starts a session through the gateway and waits for its result.
func runSession(ns, wf, input string) (string, sessions.Session) {
	resp, err := gw.Post(fmt.Sprintf("%s/v1/namespaces/%s/workflows/%s/sessions", gatewayURL(), ns, wf), "application/octet-stream", strings.NewReader(input))
	Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	Expect(resp.StatusCode).To(Equal(http.StatusCreated), string(body))
	var s sessions.Session
	Expect(json.Unmarshal(body, &s)).To(Succeed())

	resp, err = gw.Get(fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result?wait=2m", gatewayURL(), ns, s.ID))
	Expect(err).NotTo(HaveOccurred())
	result, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	st, err := gw.Get(fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s", gatewayURL(), ns, s.ID))
	Expect(err).NotTo(HaveOccurred())
	defer st.Body.Close()
	Expect(json.NewDecoder(st.Body).Decode(&s)).To(Succeed())
	Expect(resp.StatusCode).To(Equal(http.StatusOK), "result: %s\nsession: %+v", result, s)
	return string(result), s
}

var _ = Describe("sessions through the trigger engine", func() {
	It("runs a function-oriented chain and returns the sink's result", func() {
		ns := newNamespace()
		step := func(name string) v1alpha1.FunctionSpec {
			return pyFunction(name, fmt.Sprintf("def handle(inv):\n    return inv.objects[0].bytes() + b'|%s'", name))
		}
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "chain", Namespace: ns},
			Spec: v1alpha1.WorkflowSpec{
				Entry:     "first",
				Functions: []v1alpha1.FunctionSpec{step("first"), step("second"), step("third")},
				Dependencies: []v1alpha1.Dependency{
					{From: []string{"first"}, To: []string{"second"}},
					{From: []string{"second"}, To: []string{"third"}},
				},
			},
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)
		result, s := runSession(ns, "chain", "in")
		Expect(result).To(Equal("in|first|second|third"))
		Expect(s.State).To(Equal(sessions.Completed))
		Expect(s.Invocations).To(Equal(3))
	})
})

var _ = Describe("large inputs and results through the gateway", func() {
	It("holds a 1 MiB input in the operator for the entry pod to pull and streams a 2 MiB result from the producer pod", func() {
		// The trigger never fires: it only keeps mirror's return value out
		// of the output bucket, where its sent object (by reference) goes.
		ns := deploy("large", v1alpha1.WorkflowSpec{Entry: "mirror", Functions: []v1alpha1.FunctionSpec{
			pyFunction("mirror", "def handle(inv):\n    data = inv.objects[0].bytes()\n    ziptrail.send_object('output', 'result', data[::-1] + data)\n    return b''"),
		}, Triggers: []v1alpha1.NamedTrigger{trig("unused", "unused", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"mirror"}})}})
		input := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB: held by the operator, pulled by the pod's sidecar
		resp, err := gw.Post(fmt.Sprintf("%s/v1/namespaces/%s/workflows/large/sessions", gatewayURL(), ns), "application/octet-stream", strings.NewReader(input))
		Expect(err).NotTo(HaveOccurred())
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusCreated), string(body))
		var s sessions.Session
		Expect(json.Unmarshal(body, &s)).To(Succeed())
		resp, err = gw.Get(fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result?wait=2m", gatewayURL(), ns, s.ID))
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		result, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.StatusCode).To(Equal(http.StatusOK), "%.300s", result)
		reversed := []byte(input)
		slices.Reverse(reversed)
		Expect(len(result)).To(Equal(2 * len(input)))
		Expect(string(result) == string(reversed)+input).To(BeTrue(), "the result differs from the input reversed, then the input")
	})

	It("refuses a caller without credentials or without the session role", func() {
		ns := newNamespace()
		resp, err := http.Post(fmt.Sprintf("%s/v1/namespaces/%s/workflows/any/sessions", gatewayURL(), ns), "application/octet-stream", strings.NewReader("x"))
		Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guest"}}
		Expect(k8s.Create(ctx, sa)).To(Succeed())
		tr := &authv1.TokenRequest{}
		Expect(k8s.SubResource("token").Create(ctx, sa, tr)).To(Succeed())
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/namespaces/%s/sessions", gatewayURL(), ns), nil)
		req.Header.Set("Authorization", "Bearer "+tr.Status.Token)
		resp, err = http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusForbidden), string(body))
		Expect(string(body)).To(ContainSubstring("ziptrail-session-runner"))
	})
})

var _ = Describe("the ziptrail CLI", func() {
	It("runs a session with progress and lists it (ziptrail run, ziptrail sessions)", func() {
		bin := filepath.Join(GinkgoT().TempDir(), "ziptrail")
		build := exec.Command("go", "build", "-o", bin, "./cmd/ziptrail")
		build.Dir = paths.RepoRoot()
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "%s", out)

		ns := deploy("cli", v1alpha1.WorkflowSpec{Entry: "first",
			Functions: []v1alpha1.FunctionSpec{
				pyFunction("first", "def handle(inv):\n    return inv.objects[0].bytes().upper()"),
				pyFunction("second", "def handle(inv):\n    return inv.objects[0].bytes() + b'!'"),
			},
			Dependencies: []v1alpha1.Dependency{{From: []string{"first"}, To: []string{"second"}}},
		})
		run := func(stdin string, args ...string) (string, string) {
			cmd := exec.Command(bin, args...)
			cmd.Stdin = strings.NewReader(stdin)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			Expect(cmd.Run()).To(Succeed(), "ziptrail %v: %s", args, stderr.String())
			return stdout.String(), stderr.String()
		}
		result, progress := run("hello", "run", "cli", "--input", "-", "-n", ns, "--gateway", gatewayURL(), "--token", gatewayToken())
		Expect(result).To(Equal("HELLO!")) // stdout is not a terminal: no newline added
		Expect(progress).To(ContainSubstring("==> session cli-"))
		Expect(progress).To(MatchRegexp(`Invoked\s+first with 1 objects`))
		Expect(progress).To(MatchRegexp(`Invoked\s+second with 1 objects`))
		Expect(progress).To(ContainSubstring("==> Completed in "))

		table, _ := run("", "sessions", "cli", "-n", ns, "--gateway", gatewayURL(), "--token", gatewayToken())
		lines := strings.Split(strings.TrimSpace(table), "\n")
		Expect(lines).To(HaveLen(2), table)
		Expect(strings.Fields(lines[1])[1:5]).To(Equal([]string{"cli", "Completed", "2", "2"}), table)
	})
})
