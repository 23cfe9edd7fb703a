package e2e

import (
	"crypto/sha256"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/sessions"
)

var _ = Describe("objects by reference between pods", func() {
	It("moves a 10 MB object from the producer pod's memory to the consumer pod through queue-proxy-zl", func() {
		ns := newNamespace()
		produce := pyFunction("produce", `
def handle(inv):
    ziptrail.send_object("big", "blob", bytes(range(256)) * 40960)   # 10 MiB
    return b""`)
		consume := pyFunction("consume", `
import hashlib
def handle(inv):
    o = inv.objects[0]
    ziptrail.send_object("output", "digest", "%d:%s:%s" % (o.size, hashlib.sha256(o.data).hexdigest(), o._map is not None))
    return b""`)
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "byref", Namespace: ns},
			Spec: v1alpha1.WorkflowSpec{
				Entry:     "produce",
				Functions: []v1alpha1.FunctionSpec{produce, consume},
				Buckets:   []v1alpha1.NamedBucket{{Name: "big"}, {Name: "output"}},
				Triggers: []v1alpha1.NamedTrigger{{Name: "consume-blob", Spec: v1alpha1.TriggerSpec{
					Bucket: "big", Primitive: v1alpha1.Immediate, Targets: []string{"consume"}}}},
			},
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)
		blob := []byte(strings.Repeat(string(func() []byte {
			b := make([]byte, 256)
			for i := range b {
				b[i] = byte(i)
			}
			return b
		}()), 40960))
		result, s := runSession(ns, "byref", "go")
		Expect(s.State).To(Equal(sessions.Completed))
		// Mapped: the consumer read the object from shared memory, which only
		// happens when its sidecar resolved a reference (inline objects are not files).
		Expect(result).To(Equal(fmt.Sprintf("%d:%x:True", len(blob), sha256.Sum256(blob))))
	})
})
