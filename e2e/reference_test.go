package e2e

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// blobSize is the size of the objects the Zipline patterns move: 10 MiB,
// far above the inline threshold, so they travel by reference.
const blobSize = 10 << 20

// pyBlob builds a 10 MiB object whose contents depend on its key, so a
// consumer that got the wrong object (or a corrupted one) is caught by its
// checksum; blob below is the same in Go.
const pyBlob = `
def blob(key):
    unit = key.encode() + bytes(range(256))
    return (unit * (10485760 // len(unit) + 1))[:10485760]
`

// pyDigest describes an input: key, size, SHA-256 and whether the consumer
// read it from shared memory (which only happens when its queue-proxy-zl
// resolved a reference: inline objects are not files).
const pyDigest = `
import hashlib
def digest(o):
    return "%s:%d:%s:%s" % (o.key, o.size, hashlib.sha256(o.data).hexdigest(), o._map is not None)
`

func blob(key string) []byte {
	unit := []byte(key)
	for i := 0; i < 256; i++ {
		unit = append(unit, byte(i))
	}
	return bytes.Repeat(unit, blobSize/len(unit)+1)[:blobSize]
}

func expectedDigest(key string) string {
	return fmt.Sprintf("%s:%d:%x:True", key, blobSize, sha256.Sum256(blob(key)))
}

// pyReport sends the digest of every input to a bucket, one object per
// input named after it, declaring how many the join expects.
func pyReport(bucket string, expected int) string {
	return pyDigest + fmt.Sprintf(`
def handle(inv):
    for o in inv.objects:
        ziptrail.send_object(%q, o.key + "@" + inv.function, digest(o), metadata={"ziptrail.expected-count": "%d"})
    return b""`, bucket, expected)
}

// pyJoinLines writes its inputs' contents, sorted, one per line, as the result.
const pyJoinLines = `
def handle(inv):
    ziptrail.send_object("output", "result", "\n".join(sorted(o.bytes().decode() for o in inv.objects)))
    return b""`

// withBuckets declares the buckets the triggers watch, the output bucket and
// extra ones: a workflow owns every bucket its functions use.
func withBuckets(spec v1alpha1.WorkflowSpec, extra ...string) v1alpha1.WorkflowSpec {
	seen := map[string]bool{}
	for _, b := range spec.Buckets {
		seen[b.Name] = true
	}
	names := append([]string{"output"}, extra...)
	for _, t := range spec.Triggers {
		names = append(names, t.Spec.Bucket)
	}
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			spec.Buckets = append(spec.Buckets, v1alpha1.NamedBucket{Name: n})
		}
	}
	return spec
}

// deploy creates a workflow (with withBuckets) in a new namespace and waits
// until it is ready.
func deploy(name string, spec v1alpha1.WorkflowSpec) string {
	spec = withBuckets(spec)
	ns := newNamespace()
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	Expect(k8s.Create(ctx, wf)).To(Succeed())
	waitWorkflowReady(wf)
	return ns
}

var _ = Describe("objects by reference between pods (Zipline patterns, 10 MiB)", func() {
	imm := func(name, bucket string, targets ...string) v1alpha1.NamedTrigger {
		return trig(name, bucket, v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: targets})
	}
	join := func(name, bucket, target string) v1alpha1.NamedTrigger {
		return trig(name, bucket, v1alpha1.TriggerSpec{Primitive: v1alpha1.DynamicJoin, DynamicJoin: &v1alpha1.DynamicJoinParams{}, Targets: []string{target}})
	}

	It("1-1: moves an object from the producer pod's memory to the consumer pod", func() {
		ns := deploy("byref", v1alpha1.WorkflowSpec{Entry: "produce",
			Functions: []v1alpha1.FunctionSpec{
				pyFunction("produce", pyBlob+`
def handle(inv):
    ziptrail.send_object("big", "blob", blob("blob"))
    return b""`),
				pyFunction("consume", pyDigest+`
def handle(inv):
    ziptrail.send_object("output", "digest", digest(inv.objects[0]))
    return b""`),
			},
			Triggers: []v1alpha1.NamedTrigger{imm("consume-blob", "big", "consume")},
		})
		result, s := runSession(ns, "byref", "go")
		Expect(s.State).To(Equal(sessions.Completed))
		Expect(result).To(Equal(expectedDigest("blob")))
	})

	It("scatter: one producer, each of N consumers gets its own object", func() {
		const n = 4
		ns := deploy("scatter", v1alpha1.WorkflowSpec{Entry: "produce",
			Functions: []v1alpha1.FunctionSpec{
				pyFunction("produce", pyBlob+fmt.Sprintf(`
def handle(inv):
    for i in range(%d):
        ziptrail.send_object("parts", "part-%%d" %% i, blob("part-%%d" %% i))
    return b""`, n)),
				pyFunction("consume", pyReport("digests", n)),
				pyFunction("check", pyJoinLines),
			},
			Triggers: []v1alpha1.NamedTrigger{imm("consume-each", "parts", "consume"), join("check-all", "digests", "check")},
		})
		result, s := runSession(ns, "scatter", "go")
		var want []string
		for i := 0; i < n; i++ {
			want = append(want, expectedDigest(fmt.Sprintf("part-%d", i)))
		}
		Expect(strings.Split(result, "\n")).To(Equal(want))
		Expect(s.Invocations).To(Equal(1+n+1), "one consumer invocation per object")
	})

	It("gather: N producers, one consumer gets all N objects", func() {
		const n = 4
		ns := deploy("gather", v1alpha1.WorkflowSpec{Entry: "split",
			Functions: []v1alpha1.FunctionSpec{
				pyFunction("split", fmt.Sprintf(`
def handle(inv):
    for i in range(%d):
        ziptrail.send_object("tasks", "part-%%d" %% i, "go")
    return b""`, n)),
				pyFunction("produce", pyBlob+fmt.Sprintf(`
def handle(inv):
    key = inv.objects[0].key
    ziptrail.send_object("parts", key, blob(key), metadata={"ziptrail.expected-count": "%d"})
    return b""`, n)),
				pyFunction("consume", pyDigest+`
def handle(inv):
    ziptrail.send_object("output", "result", "\n".join(sorted(digest(o) for o in inv.objects)))
    return b""`),
			},
			Triggers: []v1alpha1.NamedTrigger{imm("produce-each", "tasks", "produce"), join("gather", "parts", "consume")},
		})
		result, s := runSession(ns, "gather", "go")
		var want []string
		for i := 0; i < n; i++ {
			want = append(want, expectedDigest(fmt.Sprintf("part-%d", i)))
		}
		Expect(strings.Split(result, "\n")).To(Equal(want))
		Expect(s.Invocations).To(Equal(1+n+1), "one consumer invocation with every object")
	})

	It("broadcast: one object, read by N consumers", func() {
		readers := []string{"r1", "r2", "r3"}
		fns := []v1alpha1.FunctionSpec{pyFunction("produce", pyBlob+`
def handle(inv):
    ziptrail.send_object("big", "blob", blob("blob"))
    return b""`), pyFunction("check", pyJoinLines)}
		for _, r := range readers {
			fns = append(fns, pyFunction(r, pyReport("digests", len(readers))))
		}
		ns := deploy("broadcast", v1alpha1.WorkflowSpec{Entry: "produce", Functions: fns,
			Triggers: []v1alpha1.NamedTrigger{imm("read-blob", "big", readers...), join("check-all", "digests", "check")}})
		result, s := runSession(ns, "broadcast", "go")
		var want []string
		for range readers {
			want = append(want, expectedDigest("blob"))
		}
		Expect(strings.Split(result, "\n")).To(Equal(want))
		Expect(s.Invocations).To(Equal(1 + len(readers) + 1))
	})
})
