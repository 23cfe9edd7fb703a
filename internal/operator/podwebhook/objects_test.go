package podwebhook

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// objectsPod is a revision pod of a ziptrail function as Knative makes it,
// with the Workflow controller's objects-volume annotation (256 MiB) and
// memory declared on both containers.
func objectsPod(name string) *corev1.Pod {
	p := pod(name, revisionLabels, "user-container", QueueProxy)
	p.Annotations = map[string]string{v1alpha1.AnnotationObjectsVolume: "268435456"}
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("100Mi"), corev1.ResourceCPU: resource.MustParse("1")},
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("50Mi")}}
	p.Spec.Containers[1].Resources = corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("16Mi")}}
	return p
}

func mountsObjects(c corev1.Container) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == ObjectsVolumeName && m.MountPath == v1alpha1.ObjectsDir && !m.ReadOnly {
			return true
		}
	}
	return false
}

// checkObjects: objectsPod's volume, mounts and memory after the webhook.
func checkObjects(t *testing.T, p *corev1.Pod) {
	t.Helper()
	var vol *corev1.Volume
	for i := range p.Spec.Volumes {
		if p.Spec.Volumes[i].Name == ObjectsVolumeName {
			vol = &p.Spec.Volumes[i]
		}
	}
	if vol == nil || vol.EmptyDir == nil || vol.EmptyDir.Medium != corev1.StorageMediumMemory ||
		vol.EmptyDir.SizeLimit == nil || vol.EmptyDir.SizeLimit.Value() != 256<<20 {
		t.Fatalf("objects volume %+v", vol)
	}
	for _, c := range p.Spec.Containers {
		if !mountsObjects(c) {
			t.Errorf("%s does not mount the objects volume at %s: %+v", c.Name, v1alpha1.ObjectsDir, c.VolumeMounts)
		}
	}
	mem := func(l corev1.ResourceList) string { q := l[corev1.ResourceMemory]; return q.String() }
	user, qp := p.Spec.Containers[0].Resources, p.Spec.Containers[1].Resources
	// The volume's pages are charged to whoever writes them: the user
	// container (its SDK's puts) and queue-proxy (its pulls) each may.
	if mem(user.Limits) != "356Mi" || mem(user.Requests) != "306Mi" || mem(qp.Limits) != "320Mi" || mem(qp.Requests) != "16Mi" {
		t.Errorf("memory: user %s/%s, queue-proxy %s/%s; want 356Mi/306Mi, 320Mi/16Mi",
			mem(user.Limits), mem(user.Requests), mem(qp.Limits), mem(qp.Requests))
	}
	if cpu := user.Limits[corev1.ResourceCPU]; cpu.String() != "1" {
		t.Errorf("cpu changed: %s", cpu.String())
	}
}

func TestObjectsVolume(t *testing.T) {
	p := objectsPod("fn")
	if !(ObjectsMutator{}).Mutate(p) {
		t.Fatal("not mutated")
	}
	checkObjects(t, p)
	if env := p.Spec.Containers[1].Env; len(env) != 1 || env[0].Name != envNode || env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("queue-proxy's env %+v, want its node (%s from spec.nodeName)", env, envNode)
	}
	// A reinvoked webhook adds nothing more.
	if (ObjectsMutator{}).Mutate(p) {
		t.Fatal("mutated twice")
	}
	checkObjects(t, p)
	if len(p.Spec.Volumes) != 1 || len(p.Spec.Containers[0].VolumeMounts) != 1 {
		t.Fatalf("volumes %+v mounts %+v", p.Spec.Volumes, p.Spec.Containers[0].VolumeMounts)
	}

	// No memory declared: nothing to add to; the volume's sizeLimit bounds it.
	p = pod("bare", revisionLabels, "user-container", QueueProxy)
	p.Annotations = map[string]string{v1alpha1.AnnotationObjectsVolume: "1024"}
	if !(ObjectsMutator{}).Mutate(p) {
		t.Fatal("not mutated")
	}
	if p.Spec.Containers[0].Resources.Limits != nil || p.Spec.Containers[1].Resources.Requests != nil {
		t.Errorf("resources invented: %+v", p.Spec.Containers)
	}
}

// Left alone: whatever is not a ziptrail revision pod with a sane size,
// and a pod that mounts something of its own where the objects go.
func TestObjectsVolumeLeavesOthersAlone(t *testing.T) {
	with := func(p *corev1.Pod, size string) *corev1.Pod {
		p.Annotations = map[string]string{v1alpha1.AnnotationObjectsVolume: size}
		return p
	}
	own := objectsPod("own")
	own.Spec.Volumes = []corev1.Volume{{Name: "mine", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	own.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "mine", MountPath: v1alpha1.ObjectsDir}}
	for name, p := range map[string]*corev1.Pod{
		"no annotation":       pod("a", revisionLabels, "user-container", QueueProxy),
		"not a number":        with(pod("b", revisionLabels, "user-container", QueueProxy), "1Gi"),
		"zero":                with(pod("c", revisionLabels, "user-container", QueueProxy), "0"),
		"negative":            with(pod("d", revisionLabels, "user-container", QueueProxy), "-5"),
		"absurd":              with(pod("e", revisionLabels, "user-container", QueueProxy), "99999999999999999999"),
		"not ziptrail":        with(pod("f", map[string]string{labelRevision: "x-00001"}, "user-container", QueueProxy), "1024"),
		"no queue-proxy":      with(pod("g", revisionLabels, "user-container"), "1024"),
		"only queue-proxy":    with(pod("h", revisionLabels, QueueProxy), "1024"),
		"its own objects dir": own,
	} {
		before := p.DeepCopy()
		if (ObjectsMutator{}).Mutate(p) {
			t.Errorf("%s: mutated", name)
		}
		if len(p.Spec.Volumes) != len(before.Spec.Volumes) {
			t.Errorf("%s: volumes %+v", name, p.Spec.Volumes)
		}
	}
}
