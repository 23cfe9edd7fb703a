package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// Direct messages between function instances (issue 16,
// docs/messaging.md), on the real-Knative local cluster: Python members
// join a group from their handlers, the sidecars resolve ranks through the
// operator's directory and deliver over the data plane between pods.

// pyMember is the member program: "start" fans the session input (JSON:
// size, mode, gate) out into one object per rank; "member" joins and runs
// the mode.
const pyMember = pyWaitFor + `
import json, socket
from ziptrail.errors import PeerGoneError, ForeignError, MessageTimeoutError

def verdict(gate, name, obj):
    tmp = os.path.join(gate, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.rename(tmp, os.path.join(gate, name))

def collectives(g, r, n):
    errs = []
    def check(what, got, want):
        if got != want:
            errs.append("%s: got %r, want %r" % (what, got, want))
    g.barrier()
    # point to point around the ring: small, then 1 MiB (by reference)
    g.send((r + 1) % n, b"from %d" % r, tag=5)
    m = g.recv(source=(r - 1) % n, tag=5)
    check("ring", (m.source, bytes(m.data)), ((r - 1) % n, b"from %d" % ((r - 1) % n)))
    g.send((r + 1) % n, bytes([r]) * (1 << 20), tag=6)
    m = g.recv(source=(r - 1) % n, tag=6)
    check("ring 1 MiB", bytes(m.data) == bytes([(r - 1) % n]) * (1 << 20), True)
    root = 1 % n
    check("broadcast", bytes(g.broadcast(b"bcast" if r == root else None, root=root)), b"bcast")
    check("scatter", bytes(g.scatter([b"part%d" % i for i in range(n)] if r == root else None, root=root)), b"part%d" % r)
    got = g.gather(b"g%d" % r, root=root)
    if r == root:
        check("gather", [bytes(x) for x in got], [b"g%d" % i for i in range(n)])
    got = g.reduce([float(r), 1.0], ziptrail.SUM, root=root)
    if r == root:
        check("reduce", list(got), [float(sum(range(n))), float(n)])
    check("allreduce sum", list(g.allreduce([r, 1], ziptrail.SUM)), [sum(range(n)), n])
    check("allreduce max", list(g.allreduce([float(r)], ziptrail.MAX)), [float(n - 1)])
    check("allreduce min", list(g.allreduce([r], ziptrail.MIN)), [0])
    s = list(g.allreduce([float(r)] * 16384, ziptrail.SUM))  # 128 KiB: the ring algorithm
    check("ring allreduce", (len(s), s[0], s[-1]), (16384, float(sum(range(n))), float(sum(range(n)))))
    check("user-function allreduce", list(g.allreduce([r + 1], lambda a, b: [x * y for x, y in zip(a, b)])),
          [__import__("math").prod(range(1, n + 1))])
    got = g.alltoall([b"%d->%d" % (r, j) for j in range(n)])
    check("alltoall", [bytes(x) for x in got], [b"%d->%d" % (i, r) for i in range(n)])
    g.barrier()
    return errs

def start(inv):
    spec = json.loads(inv.objects[0].bytes())
    for r in range(spec["size"]):
        ziptrail.send_object("members", "m%d" % r, json.dumps(dict(spec, rank=r)))
    return b""

def member(inv):
    spec = json.loads(inv.objects[0].bytes())
    r, n, mode, gate = spec["rank"], spec["size"], spec["mode"], spec.get("gate", "")
    out = {"rank": r, "pod": socket.gethostname()}
    done = {"ziptrail.expected-count": str(n)}
    if mode == "collectives":
        with ziptrail.join("c", r, n, wait_all=True, timeout=300) as g:
            out["errors"] = collectives(g, r, n)
            att = g._att  # each path this member's sends took: the sidecars, a socketpair, TCP
            out["paths"] = {str(t): "sidecar" if o.sock is None else "tcp" if o.sock.stream else "unix"
                            for t, o in (att._outs.items() if att is not None else ())}
        ziptrail.send_object("verdicts", "v%d" % r, json.dumps(out), metadata=done)
    elif mode == "kill":
        with ziptrail.join("k", r, n, wait_all=True, timeout=300) as g:
            try:
                for i in range(1000000):
                    if i == 5 and r == n - 1:
                        verdict(gate, "victim", out)  # a few allreduces in: kill it now
                    g.allreduce([1.0] * 1024, ziptrail.SUM, timeout=120)
                out["error"] = "no PeerGone"
            except PeerGoneError as e:
                out["gone"], out["at"] = e.rank, time.time()
        verdict(gate, "rank-%d" % r, out)
    elif mode == "drain":
        with ziptrail.join("d", r, n, wait_all=True, timeout=300) as g:
            verdict(gate, "ready-%d" % r, out)
            wait_for(os.path.join(gate, "go"), limit=300)
            out["sum"] = list(g.allreduce([r + 1], ziptrail.SUM, timeout=120))
            g.barrier(timeout=120)
        ziptrail.send_object("verdicts", "v%d" % r, json.dumps(out), metadata=done)
    return b""

def report(inv):
    ziptrail.send_object("output", "result", json.dumps(sorted((json.loads(o.bytes()) for o in inv.objects), key=lambda v: v["rank"])))
    return b""
`

func memberFunction(name, call string) v1alpha1.FunctionSpec {
	return pyFunction(name, pyMember+"\nhandle = "+call+"\n")
}

// groupWorkflow deploys start -> size x member -> report; cc is the
// members' container concurrency (members per pod at most).
func groupWorkflow(name string, maxScale int32, cc int64) string {
	return deploy(name, withBuckets(v1alpha1.WorkflowSpec{Entry: "start",
		Functions: []v1alpha1.FunctionSpec{
			memberFunction("start", "start"),
			scaled(memberFunction("member", "member"), 1, maxScale, cc, nil),
			memberFunction("report", "report"),
		},
		Triggers: []v1alpha1.NamedTrigger{
			trig("each-member", "members", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"member"}}),
			trig("report", "verdicts", v1alpha1.TriggerSpec{Primitive: v1alpha1.DynamicJoin,
				DynamicJoin: &v1alpha1.DynamicJoinParams{Sources: []string{"member"}}, Targets: []string{"report"}}),
		},
	}))
}

type memberVerdict struct {
	Rank   int               `json:"rank"`
	Pod    string            `json:"pod"`
	Paths  map[string]string `json:"paths"`
	Errors []string          `json:"errors"`
	Sum    []int             `json:"sum"`
	Gone   *int              `json:"gone"`
	At     float64           `json:"at"`
	Error  string            `json:"error"`
}

func readVerdict(path string) (memberVerdict, error) {
	var v memberVerdict
	data, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(data, &v)
	}
	return v, err
}

func pods(vs []memberVerdict) map[string]bool {
	out := map[string]bool{}
	for _, v := range vs {
		out[v.Pod] = true
	}
	return out
}

var _ = Describe("direct messages between function instances", func() {
	for _, tc := range []struct {
		size     int
		cc       int64
		minPods  int
		maxScale int32
	}{{4, 1, 4, 4}, {8, 2, 4, 4}} {
		It(fmt.Sprintf("runs point to point and every collective across pods with %d members", tc.size), func() {
			ns := groupWorkflow(fmt.Sprintf("coll%d", tc.size), tc.maxScale, tc.cc)
			input := fmt.Sprintf(`{"size": %d, "mode": "collectives"}`, tc.size)
			result, s := runSession(ns, fmt.Sprintf("coll%d", tc.size), input)
			Expect(s.State).To(Equal(sessions.Completed), "session: %+v", s)
			var vs []memberVerdict
			Expect(json.Unmarshal([]byte(result), &vs)).To(Succeed(), result)
			Expect(vs).To(HaveLen(tc.size))
			for _, v := range vs {
				Expect(v.Errors).To(BeEmpty(), "rank %d on %s", v.Rank, v.Pod)
			}
			// With at most cc members per pod, the group spans pods.
			Expect(len(pods(vs))).To(BeNumerically(">=", tc.minPods), "members' pods: %v", pods(vs))
			// Every pair's path: across nodes over TCP; on one node (one
			// pod too) over a socketpair with the chart's sameNode, else
			// TCP between pods and the sidecar within one.
			node := map[string]string{}
			for p := range pods(vs) {
				var pod corev1.Pod
				Expect(k8s.Get(ctx, keyOf(ns, p), &pod)).To(Succeed())
				node[p] = pod.Spec.NodeName
			}
			count := map[string]int{}
			for _, v := range vs {
				for to, path := range v.Paths {
					var r int
					_, _ = fmt.Sscan(to, &r)
					w := vs[r]
					want := []string{"tcp"}
					switch {
					case w.Pod == v.Pod:
						want = []string{"unix", "sidecar"}
					case node[w.Pod] == node[v.Pod]:
						want = []string{"unix", "tcp"}
					}
					Expect(want).To(ContainElement(path), "rank %d (%s on %s) -> rank %d (%s on %s)", v.Rank, v.Pod, node[v.Pod], r, w.Pod, node[w.Pod])
					count[path]++
				}
			}
			AddReportEntry(fmt.Sprintf("collectives with %d members", tc.size), fmt.Sprintf("%d pods, paths %v", len(pods(vs)), count))
		})
	}

	It("tells every member PeerGone when one member's process is SIGKILLed mid-collective", func() {
		if cluster == nil {
			Skip("kills processes in local pods; the kind target has none")
		}
		const n = 4
		gate := gateDir()
		ns := groupWorkflow("kill", n, 1)
		startSession(ns, "kill", fmt.Sprintf(`{"size": %d, "mode": "kill", "gate": %q}`, n, gate))
		var victim memberVerdict
		Eventually(func() error {
			var err error
			victim, err = readVerdict(filepath.Join(gate, "victim"))
			return err
		}).WithTimeout(5 * time.Minute).Should(Succeed())
		var pod corev1.Pod
		Expect(k8s.Get(ctx, keyOf(ns, victim.Pod), &pod)).To(Succeed())
		killed := time.Now()
		Expect(cluster.KillUserProcess(ctx, &pod, "python3")).To(Succeed())
		var lat []string
		for r := range n - 1 {
			var v memberVerdict
			Eventually(func() error {
				var err error
				v, err = readVerdict(filepath.Join(gate, fmt.Sprintf("rank-%d", r)))
				return err
			}).WithTimeout(2*time.Minute).Should(Succeed(), "rank %d's verdict", r)
			Expect(v.Error).To(BeEmpty())
			Expect(v.Gone).NotTo(BeNil(), "rank %d got no PeerGone", r)
			Expect(*v.Gone).To(Equal(n-1), "rank %d: PeerGone names the killed rank", r)
			lat = append(lat, fmt.Sprintf("rank %d: %.0f ms", r, (v.At-float64(killed.UnixNano())/1e9)*1000))
		}
		// The time from just before the kill command (kubectl exec, which
		// itself takes a while) to each member's PeerGone; reported, not
		// asserted (bench/messaging measures detection latency).
		AddReportEntry("PeerGone after the kill", strings.Join(lat, ", "))
		GinkgoWriter.Printf("PeerGone after the kill (from before kubectl exec): %s\n", strings.Join(lat, ", "))
	})

	It("keeps a live group whole while one member's pod is deleted (as a scale-down would)", func() {
		const n = 2
		gate := gateDir()
		ns := groupWorkflow("drain", n, 1)
		id := startSession(ns, "drain", fmt.Sprintf(`{"size": %d, "mode": "drain", "gate": %q}`, n, gate))
		var v1 memberVerdict
		Eventually(func() error {
			var err error
			v1, err = readVerdict(filepath.Join(gate, "ready-1"))
			if err == nil {
				_, err = readVerdict(filepath.Join(gate, "ready-0"))
			}
			return err
		}).WithTimeout(5 * time.Minute).Should(Succeed())
		// Rank 1's pod terminates: SIGTERM to its queue-proxy-zl, Knative's
		// drain. The member's invocation is in flight; its sidecar keeps
		// the data plane and local API until the member leaves.
		var pod corev1.Pod
		Expect(k8s.Get(ctx, keyOf(ns, v1.Pod), &pod)).To(Succeed())
		Expect(k8s.Delete(ctx, &pod)).To(Succeed())
		Eventually(func(g Gomega) {
			var p corev1.Pod
			g.Expect(k8s.Get(ctx, keyOf(ns, v1.Pod), &p)).To(Succeed())
			g.Expect(p.DeletionTimestamp).NotTo(BeNil())
		}).WithTimeout(time.Minute).Should(Succeed())
		// The node agent sends queue-proxy-zl SIGTERM right after the
		// deletion (it has no preStop hook). The pod stays Ready while it
		// drains; its sidecar's log says it is draining for a live member.
		Eventually(func(g Gomega) {
			logs, err := cluster.Clientset.CoreV1().Pods(ns).GetLogs(v1.Pod, &corev1.PodLogOptions{Container: "queue-proxy"}).DoRaw(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(string(logs)).To(ContainSubstring("terminating with 1 group member(s) running here"))
		}).WithTimeout(time.Minute).Should(Succeed())
		Expect(os.WriteFile(filepath.Join(gate, "go"), nil, 0o644)).To(Succeed())
		result := sessionResult(ns, id)
		var vs []memberVerdict
		Expect(json.Unmarshal([]byte(result), &vs)).To(Succeed(), result)
		Expect(vs).To(HaveLen(n))
		for _, v := range vs {
			Expect(v.Sum).To(Equal([]int{3}), "rank %d", v.Rank)
		}
	})

	It("delivers a mailbox's messages to an instance that joins after they were sent", func() {
		ns := deploy("mailbox", withBuckets(v1alpha1.WorkflowSpec{Entry: "early",
			Functions: []v1alpha1.FunctionSpec{
				pyFunction("early", `
import json
def handle(inv):
    with ziptrail.join("mb", 0, 2, mailbox=True) as g:
        held = [g.send(1, b"m%d" % i) for i in range(3)]
        held.append(g.send(1, bytes(range(256)) * 1200, tag=1))  # 300 KiB: by reference
    ziptrail.send_object("later", "go", json.dumps(held))
    return b""`),
				pyFunction("late", `
import json
def handle(inv):
    held = json.loads(inv.objects[0].bytes())
    with ziptrail.join("mb", 1, 2, mailbox=True) as g:
        got = [bytes(g.recv(source=0, tag=0, timeout=60).data).decode() for _ in range(3)]
        big = bytes(g.recv(source=0, tag=1, timeout=60).data)
    ziptrail.send_object("output", "result", json.dumps({"held": held, "got": got, "big": big == bytes(range(256)) * 1200}))
    return b""`),
			},
			Triggers: []v1alpha1.NamedTrigger{trig("later", "later", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"late"}})},
		}))
		result, s := runSession(ns, "mailbox", "go")
		Expect(s.State).To(Equal(sessions.Completed))
		Expect(result).To(MatchJSON(`{"held": [true, true, true, true], "got": ["m0", "m1", "m2"], "big": true}`))
	})

	It("refuses a join to another namespace's session, and nothing reaches its members", func() {
		gate := gateDir()
		nsA := deploy("holder", withBuckets(v1alpha1.WorkflowSpec{Entry: "hold",
			Functions: []v1alpha1.FunctionSpec{pyFunction("hold", pyMember+`
def handle(inv):
    with ziptrail.join("x", 0, 2) as g:
        verdict(inv.objects[0].bytes().decode(), "holder", {"session": inv.session})
        try:
            m = g.recv(source=ziptrail.ANY, timeout=20)
            out = "received %r" % bytes(m.data)
        except MessageTimeoutError:
            out = "nothing"
    ziptrail.send_object("output", "result", out)
    return b""`)}}))
		nsB := deploy("intruder", withBuckets(v1alpha1.WorkflowSpec{Entry: "intrude",
			Functions: []v1alpha1.FunctionSpec{pyFunction("intrude", `
import json
def handle(inv):
    session = inv.objects[0].bytes().decode()
    try:
        with ziptrail.join("x", 1, 2, session=session) as g:
            g.send(0, b"intruded")
        out = "joined"
    except ziptrail.errors.ForeignError as e:
        out = "foreign: %s" % e
    ziptrail.send_object("output", "result", out)
    return b""`)}}))
		idA := startSession(nsA, "holder", gate)
		var holder struct {
			Session string `json:"session"`
		}
		Eventually(func() error {
			data, err := os.ReadFile(filepath.Join(gate, "holder"))
			if err == nil {
				err = json.Unmarshal(data, &holder)
			}
			return err
		}).WithTimeout(5 * time.Minute).Should(Succeed())
		Expect(holder.Session).To(Equal(idA))
		intruded, s := runSession(nsB, "intruder", idA)
		Expect(s.State).To(Equal(sessions.Completed))
		Expect(intruded).To(HavePrefix("foreign: "))
		Expect(sessionResult(nsA, idA)).To(Equal("nothing"))
	})
})

func keyOf(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}
