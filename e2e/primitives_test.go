package e2e

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// keysOf is a Python handler that writes the sorted keys (and count) of its
// inputs to the output bucket.
const keysOf = `
def handle(inv):
    keys = sorted(o.key for o in inv.objects)
    ziptrail.send_object("output", "result", "%d:%s" % (len(keys), ",".join(keys)))
    return b""`

// emit is a Python handler that sends objects to a bucket: (bucket, key, metadata) tuples.
func emit(objs string) string {
	return fmt.Sprintf(`
def handle(inv):
    for bucket, key, meta in %s:
        ziptrail.send_object(bucket, key, key, metadata=meta)
    return b""`, objs)
}

func trig(name, bucket string, spec v1alpha1.TriggerSpec) v1alpha1.NamedTrigger {
	spec.Bucket = bucket
	return v1alpha1.NamedTrigger{Name: name, Spec: spec}
}

// runPrimitive deploys a workflow whose entry is "entry", runs one session
// with input and returns its result and final state.
func runPrimitive(name, input string, fns []v1alpha1.FunctionSpec, triggers []v1alpha1.NamedTrigger) (string, sessions.Session) {
	ns := deploy(name, v1alpha1.WorkflowSpec{Entry: "entry", Functions: fns, Triggers: triggers})
	result, s := runSession(ns, name, input)
	Expect(s.State).To(Equal(sessions.Completed))
	return result, s
}

var _ = Describe("every trigger primitive end to end", func() {
	It("Immediate invokes its target once per object, at once", func() {
		result, s := runPrimitive("immediate", "go", []v1alpha1.FunctionSpec{
			pyFunction("entry", emit(`[("items", k, {}) for k in "abc"]`)),
			// Each invocation reports the keys it got: exactly its own object.
			pyFunction("each", `
def handle(inv):
    ziptrail.send_object("seen", inv.objects[0].key, ",".join(o.key for o in inv.objects))
    return b""`),
			pyFunction("collect", `
def handle(inv):
    ziptrail.send_object("output", "result", ";".join(sorted("%s=%s" % (o.key, o.bytes().decode()) for o in inv.objects)))
    return b""`),
		}, []v1alpha1.NamedTrigger{
			trig("each-item", "items", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"each"}}),
			trig("all-seen", "seen", v1alpha1.TriggerSpec{Primitive: v1alpha1.BySet,
				BySet: &v1alpha1.BySetParams{Keys: []string{"a", "b", "c"}}, Targets: []string{"collect"}}),
		})
		Expect(result).To(Equal("a=a;b=b;c=c"))
		Expect(s.Invocations).To(Equal(5), "entry + 3 × each + collect")
	})

	It("ByName fires only for its key", func() {
		result, s := runPrimitive("byname", "go", []v1alpha1.FunctionSpec{
			pyFunction("entry", emit(`[("decisions", "rejected", {}), ("decisions", "approved", {})]`)),
			pyFunction("notify", keysOf),
		}, []v1alpha1.NamedTrigger{trig("on-approved", "decisions", v1alpha1.TriggerSpec{Primitive: v1alpha1.ByName,
			ByName: &v1alpha1.ByNameParams{Key: "approved"}, Targets: []string{"notify"}})})
		Expect(result).To(Equal("1:approved"))
		Expect(s.Invocations).To(Equal(2))
	})

	It("BySet fans in once the whole set is present", func() {
		result, s := runPrimitive("byset", "go", []v1alpha1.FunctionSpec{
			pyFunction("entry", emit(`[("parts", "b", {}), ("parts", "x", {}), ("parts", "a", {}), ("parts", "c", {})]`)),
			pyFunction("join", keysOf),
		}, []v1alpha1.NamedTrigger{trig("join", "parts", v1alpha1.TriggerSpec{Primitive: v1alpha1.BySet,
			BySet: &v1alpha1.BySetParams{Keys: []string{"a", "b", "c"}}, Targets: []string{"join"}})})
		Expect(result).To(Equal("3:a,b,c"))
		Expect(s.Invocations).To(Equal(2))
	})

	It("ByBatchSize invokes once per full batch", func() {
		result, s := runPrimitive("bybatch", "go", []v1alpha1.FunctionSpec{
			pyFunction("entry", emit(`[("stream", "e%d" % i, {}) for i in range(6)]`)),
			pyFunction("agg", `
def handle(inv):
    ziptrail.send_object("sums", "batch-" + min(o.key for o in inv.objects), str(len(inv.objects)),
                         metadata={"ziptrail.expected-count": "2"})
    return b""`),
			pyFunction("collect", `
def handle(inv):
    ziptrail.send_object("output", "result", ",".join(sorted(o.bytes().decode() for o in inv.objects)))
    return b""`),
		}, []v1alpha1.NamedTrigger{
			trig("batches", "stream", v1alpha1.TriggerSpec{Primitive: v1alpha1.ByBatchSize,
				ByBatchSize: &v1alpha1.ByBatchSizeParams{Size: 3}, Targets: []string{"agg"}}),
			trig("gather", "sums", v1alpha1.TriggerSpec{Primitive: v1alpha1.DynamicJoin,
				DynamicJoin: &v1alpha1.DynamicJoinParams{}, Targets: []string{"collect"}}),
		})
		Expect(result).To(Equal("3,3"))
		Expect(s.Invocations).To(Equal(4), "entry + 2 batches + collect")
	})

	It("ByTime aggregates a window when it expires", func() {
		result, s := runPrimitive("bytime", "go", []v1alpha1.FunctionSpec{
			pyFunction("entry", emit(`[("events", "e1", {}), ("events", "e2", {}), ("events", "e3", {})]`)),
			pyFunction("agg", keysOf),
		}, []v1alpha1.NamedTrigger{trig("window", "events", v1alpha1.TriggerSpec{Primitive: v1alpha1.ByTime,
			ByTime: &v1alpha1.ByTimeParams{Window: metav1.Duration{Duration: 300 * time.Millisecond}}, Targets: []string{"agg"}})})
		Expect(result).To(Equal("3:e1,e2,e3"))
		Expect(s.Invocations).To(Equal(2))
		// The window closes 300 ms after its first object, not at once.
		Expect(s.Ended.Sub(s.Started)).To(BeNumerically(">=", 300*time.Millisecond))
	})

	It("Redundant fires once on the k-th of n", func() {
		result, s := runPrimitive("redundant", "go", []v1alpha1.FunctionSpec{
			pyFunction("entry", emit(`[("votes", "r1", {}), ("votes", "r2", {}), ("votes", "r3", {})]`)),
			pyFunction("vote", keysOf),
		}, []v1alpha1.NamedTrigger{trig("two-of-three", "votes", v1alpha1.TriggerSpec{Primitive: v1alpha1.Redundant,
			Redundant: &v1alpha1.RedundantParams{K: 2, N: 3}, Targets: []string{"vote"}})})
		Expect(result).To(MatchRegexp(`^2:r[123],r[123]$`))
		Expect(s.Invocations).To(Equal(2), "the third vote does not fire again")
	})

	It("DynamicJoin waits for the set its producers declare at run time", func() {
		// The input decides the fan-out; each square declares how many
		// squares the join must wait for.
		result, s := runPrimitive("dynjoin", "5", []v1alpha1.FunctionSpec{
			pyFunction("entry", `
def handle(inv):
    for i in range(int(inv.objects[0].bytes())):
        ziptrail.send_object("tasks", "t%d" % i, str(i))
    return b""`),
			pyFunction("square", `
def handle(inv):
    o = inv.objects[0]
    n = int(o.bytes())
    ziptrail.send_object("squares", o.key, str(n * n), metadata={"ziptrail.expected-count": "5"})
    return b""`),
			pyFunction("sum", `
def handle(inv):
    vals = sorted(int(o.bytes()) for o in inv.objects)
    ziptrail.send_object("output", "result", "%d:%d" % (len(vals), sum(vals)))
    return b""`),
		}, []v1alpha1.NamedTrigger{
			trig("square-each", "tasks", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"square"}}),
			trig("sum-all", "squares", v1alpha1.TriggerSpec{Primitive: v1alpha1.DynamicJoin,
				DynamicJoin: &v1alpha1.DynamicJoinParams{Sources: []string{"square"}}, Targets: []string{"sum"}}),
		})
		Expect(result).To(Equal("5:30")) // 0+1+4+9+16
		Expect(s.Invocations).To(Equal(7), "entry + 5 squares + one join")
	})

	It("DynamicGroup fires each group once its sources have finished", func() {
		result, s := runPrimitive("dyngroup", "go", []v1alpha1.FunctionSpec{
			pyFunction("entry", emit(`[("shuffle", k, {"g": g}) for k, g in [("a", "x"), ("b", "y"), ("c", "x"), ("d", "x"), ("e", "y")]]`)),
			pyFunction("reduce", `
def handle(inv):
    keys = ",".join(sorted(o.key for o in inv.objects))
    ziptrail.send_object("groups", inv.group, inv.group + "=" + keys, metadata={"ziptrail.expected-count": "2"})
    return b""`),
			pyFunction("collect", `
def handle(inv):
    ziptrail.send_object("output", "result", ";".join(sorted(o.bytes().decode() for o in inv.objects)))
    return b""`),
		}, []v1alpha1.NamedTrigger{
			trig("by-group", "shuffle", v1alpha1.TriggerSpec{Primitive: v1alpha1.DynamicGroup,
				DynamicGroup: &v1alpha1.DynamicGroupParams{GroupMetadataKey: "g", Sources: []string{"entry"}}, Targets: []string{"reduce"}}),
			trig("gather", "groups", v1alpha1.TriggerSpec{Primitive: v1alpha1.DynamicJoin,
				DynamicJoin: &v1alpha1.DynamicJoinParams{}, Targets: []string{"collect"}}),
		})
		Expect(result).To(Equal("x=a,c,d;y=b,e"))
		Expect(s.Invocations).To(Equal(4), "entry + one reduce per group + collect")
	})
})
