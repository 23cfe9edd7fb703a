package e2e

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/podwebhook"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// A pod's /dev/shm is 64 MiB (containerd's and CRI-O's default, which the
// node agent mimics), and a function pod keeps its objects there unless the
// pod webhook gives it the objects volume the Workflow controller sizes from
// its buckets (internal/operator/podwebhook/objects.go). Before it, this spec failed
// in the producer with "No space left on device".
var _ = Describe("the objects volume", func() {
	It("gives function pods memory sized from their buckets: a 160 MiB object goes from pod to pod", func() {
		const size = 160 << 20
		q := resource.MustParse("256Mi")
		ns := deploy("shmvol", v1alpha1.WorkflowSpec{Entry: "produce",
			Buckets: []v1alpha1.NamedBucket{{Name: "big", Spec: v1alpha1.BucketSpec{MemoryLimitPerPod: &q}}},
			Functions: []v1alpha1.FunctionSpec{
				pyFunction("produce", fmt.Sprintf(`
def handle(inv):
    ziptrail.send_object("big", "blob", bytes(range(256)) * (%d // 256), session=inv.session)
    return b""`, size)),
				pyFunction("consume", `
import hashlib, os
def handle(inv):
    o = inv.objects[0]
    st = os.statvfs(os.path.dirname(os.environ["ZIPTRAIL_SHM_DIR"]))
    ziptrail.send_object("output", "result", "%d:%s:%d" % (o.size, hashlib.sha256(o.data).hexdigest(), st.f_blocks * st.f_frsize))
    return b""`),
			},
			Triggers: []v1alpha1.NamedTrigger{trig("consume-big", "big", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"consume"}})},
		})
		start := time.Now()
		result, s := runSession(ns, "shmvol", "go")
		Expect(s.State).To(Equal(sessions.Completed), "%+v", s)
		// The store's cap (the bucket's 256 MiB) and as much again for inputs.
		Expect(result).To(Equal(fmt.Sprintf("%d:%x:%d", size, sha256.Sum256(ramp(size)), 512<<20)))
		AddReportEntry("160 MiB pod to pod", time.Since(start))

		// Both pods: the volume, mounted in every container, queue-proxy's too.
		expectObjectsVolume(ns, 512<<20)
	})

	// Inside a handler a large send_object goes into the pod's store at once
	// and the response carries its reference (sdk/python server.py
	// BY_REFERENCE): before, the sidecar refused a response over 64 MiB
	// ("function outputs: they exceed 67108864 bytes").
	It("sends a 100 MiB object from inside a Python handler by reference", func() {
		const size = 100 << 20
		ns := deploy("bigout", v1alpha1.WorkflowSpec{Entry: "produce",
			Functions: []v1alpha1.FunctionSpec{
				pyFunction("produce", fmt.Sprintf(`
def handle(inv):
    ziptrail.send_object("big", "blob", bytes(range(256)) * (%d // 256))
    return b""`, size)),
				pyFunction("consume", `
import hashlib
def handle(inv):
    o = inv.objects[0]
    ziptrail.send_object("output", "result", "%d:%s" % (o.size, hashlib.sha256(o.data).hexdigest()))
    return b""`),
			},
			Triggers: []v1alpha1.NamedTrigger{trig("consume-big", "big", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"consume"}})},
		})
		result, s := runSession(ns, "bigout", "go")
		Expect(s.State).To(Equal(sessions.Completed), "%+v", s)
		Expect(result).To(Equal(fmt.Sprintf("%d:%x", size, sha256.Sum256(ramp(size)))))
	})
})

// ramp is bytes(range(256)) * (n // 256), as the specs' Python makes it.
func ramp(n int) []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return []byte(strings.Repeat(string(b), n/256))
}

// expectObjectsVolume: every function pod of ns has the objects volume of
// the size, mounted in every container, queue-proxy's too.
func expectObjectsVolume(ns string, size int64) {
	var pods corev1.PodList
	Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.HasLabels{v1alpha1.LabelFunction})).To(Succeed())
	Expect(pods.Items).NotTo(BeEmpty())
	for _, p := range pods.Items {
		found := false
		for _, v := range p.Spec.Volumes {
			if v.Name == podwebhook.ObjectsVolumeName {
				found = v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory && v.EmptyDir.SizeLimit.Value() == size
			}
		}
		Expect(found).To(BeTrue(), "pod %s volumes %+v", p.Name, p.Spec.Volumes)
		for _, c := range p.Spec.Containers {
			Expect(c.VolumeMounts).To(ContainElement(HaveField("MountPath", v1alpha1.ObjectsDir)), "pod %s container %s", p.Name, c.Name)
		}
	}
}
