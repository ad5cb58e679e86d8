package manager

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/loom-dev/loom/internal/inventory"
)

// What the reconcilers read of a pod survives the cache's trim; the rest
// goes.
func TestTrimPodKeepsWhatReconcilersRead(t *testing.T) {
	gpu := corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "w", Labels: map[string]string{"a": "b"},
			Annotations:     map[string]string{"loom.dev/ray-template-hash": "h", lastApplied: "{...}"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: ptr.To(true)}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "x"}}},
		Spec: corev1.PodSpec{
			NodeName: "n1",
			InitContainers: []corev1.Container{{Name: "sidecar", Image: "i", Resources: gpu, RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
				Env: []corev1.EnvVar{{Name: "A", Value: "1"}}}},
			Containers: []corev1.Container{{Name: "main", Image: "big", Command: []string{"python"}, Resources: gpu,
				Ports:         []corev1.ContainerPort{{Name: "metrics", ContainerPort: 8080}},
				LivenessProbe: &corev1.Probe{}, Env: []corev1.EnvVar{{Name: "B", Value: "2"}}}},
			Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: "Memory"}}},
				{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}}},
			Affinity: &corev1.Affinity{},
		},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, PodIP: "10.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Image: "big", ImageID: "sha", RestartCount: 1,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}}}},
	}
	gpusBefore := inventory.PodGPUs(&p.Spec)
	o, err := TrimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	got := o.(*corev1.Pod)
	if inventory.PodGPUs(&got.Spec) != gpusBefore || gpusBefore != 4 {
		t.Errorf("GPUs %d, want %d", inventory.PodGPUs(&got.Spec), gpusBefore)
	}
	if got.Spec.NodeName != "n1" || got.Labels["a"] != "b" || got.Annotations["loom.dev/ray-template-hash"] != "h" ||
		len(got.OwnerReferences) != 1 || got.Status.PodIP != "10.0.0.1" || got.Status.Phase != corev1.PodFailed ||
		len(got.Status.Conditions) != 1 || got.Spec.Containers[0].Ports[0].Name != "metrics" {
		t.Errorf("lost what reconcilers read: %+v", got)
	}
	if cs := got.Status.ContainerStatuses[0]; cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 137 || cs.RestartCount != 1 || cs.Image != "" {
		t.Errorf("container status %+v", cs)
	}
	if v := got.Spec.Volumes; v[0].EmptyDir == nil || v[1].EmptyDir != nil || v[1].ConfigMap != nil {
		t.Errorf("volumes %+v", v)
	}
	c := got.Spec.Containers[0]
	if c.Image != "" || c.Command != nil || c.Env != nil || c.LivenessProbe != nil || got.Spec.Affinity != nil ||
		got.ManagedFields != nil || got.Annotations[lastApplied] != "" || got.Spec.InitContainers[0].Env != nil {
		t.Errorf("kept what nobody reads: %+v", got)
	}
}
