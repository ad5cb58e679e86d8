package manager

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
)

func bigPod(owner metav1.OwnerReference) *corev1.Pod {
	gpu := corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2"), "cpu": resource.MustParse("1")}}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "ns", UID: "u1", ResourceVersion: "7", Labels: map[string]string{"a": "b"},
			Annotations:     map[string]string{"loom.dev/ray-template-hash": "h", lastApplied: "{...}"},
			OwnerReferences: []metav1.OwnerReference{owner},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "x"}}},
		Spec: corev1.PodSpec{
			NodeName: "n1",
			InitContainers: []corev1.Container{{Name: "sidecar", Image: "i", Resources: gpu, RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
				Env: []corev1.EnvVar{{Name: "A", Value: "1"}}}, {Name: "setup", Image: "i"}},
			Containers: []corev1.Container{{Name: "main", Image: "big", Command: []string{"python"}, Resources: gpu,
				Ports:         []corev1.ContainerPort{{Name: "metrics", ContainerPort: 8080}},
				LivenessProbe: &corev1.Probe{}, Env: []corev1.EnvVar{{Name: "B", Value: "2"}}},
				{Name: "log", Image: "fluent"}},
			Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: "Memory"}}},
				{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}}},
			Affinity:    &corev1.Affinity{},
			Tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, PodIP: "10.0.0.1", Reason: "Evicted", Message: "m",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Image: "big", ImageID: "sha", RestartCount: 1,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}}}},
	}
}

// A TrainingJob's or RayCluster's pod keeps what their reconcilers read;
// the rest goes.
func TestTrimPodKeepsWhatWorkloadReconcilersRead(t *testing.T) {
	for _, owner := range []metav1.OwnerReference{
		{APIVersion: "training.loom.dev/v1alpha1", Kind: "TrainingJob", Name: "job", Controller: ptr.To(true)},
		{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "rc", Controller: ptr.To(true)},
	} {
		p := bigPod(owner)
		o, err := TrimPod(p)
		if err != nil {
			t.Fatal(err)
		}
		got := o.(*corev1.Pod)
		if n := inventory.PodGPUs(&got.Spec); n != 4 {
			t.Errorf("%s: GPUs %d, want 4", owner.Kind, n)
		}
		if got.Spec.NodeName != "n1" || got.Labels["a"] != "b" || got.Annotations["loom.dev/ray-template-hash"] != "h" ||
			len(got.OwnerReferences) != 1 || got.Status.PodIP != "10.0.0.1" || got.Status.Phase != corev1.PodFailed ||
			got.Status.Reason != "Evicted" || got.Status.Message != "m" ||
			len(got.Status.Conditions) != 1 || got.Spec.Containers[0].Ports[0].Name != "metrics" {
			t.Errorf("%s: lost what reconcilers read: %+v", owner.Kind, got)
		}
		if cs := got.Status.ContainerStatuses[0]; cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 137 || cs.RestartCount != 1 || cs.Image != "" {
			t.Errorf("%s: container status %+v", owner.Kind, cs)
		}
		c := got.Spec.Containers[0]
		if _, ok := c.Resources.Limits["cpu"]; ok || c.Resources.Limits.Name("nvidia.com/gpu", resource.DecimalSI).Value() != 2 {
			t.Errorf("%s: resources %v, want only the GPUs", owner.Kind, c.Resources)
		}
		if c.Image != "" || c.Command != nil || c.Env != nil || c.LivenessProbe != nil || got.Spec.Affinity != nil ||
			got.Spec.Volumes != nil || got.Spec.Tolerations != nil ||
			got.ManagedFields != nil || got.Annotations[lastApplied] != "" || got.Spec.InitContainers[0].Env != nil {
			t.Errorf("%s: kept what nobody reads: %+v", owner.Kind, got)
		}
	}
}

// A batch Job's pod keeps, besides the skeleton, its controller, the labels
// the Job controller puts on it (the Job's selector) and why it waits: a
// RayJob's status quotes its submitter's pods, found by the Job's selector
// whether or not they carry the RayJob's labels (an earlier Loom's did
// not). The rest of its status and labels go.
func TestTrimPodKeepsWhyAJobPodWaits(t *testing.T) {
	owner := metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: "rayjob", UID: "j1", Controller: ptr.To(true)}
	p := bigPod(owner)
	batch := map[string]string{"batch.kubernetes.io/controller-uid": "j1", "batch.kubernetes.io/job-name": "rayjob", "controller-uid": "j1", "job-name": "rayjob"}
	for k, v := range batch {
		p.Labels[k] = v
	}
	unplaced := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available"}
	p.Status.Conditions = append(p.Status.Conditions, unplaced)
	pull := &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image"}
	p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: "log", Image: "fluent", State: corev1.ContainerState{Waiting: pull}})
	o, err := TrimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	got := o.(*corev1.Pod)
	want := gpuSkeleton(bigPod(owner))
	want.Labels, want.OwnerReferences = batch, []metav1.OwnerReference{owner}
	want.Status.Conditions = []corev1.PodCondition{unplaced}
	want.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "log", State: corev1.ContainerState{Waiting: pull}}}
	if !apiequality.Semantic.DeepEqual(got, want) {
		t.Fatalf("the Job's pod: got %+v\nwant %+v", got, want)
	}
}

// Every other pod keeps only what the inventory reads: name, node, phase and
// GPU requests, sidecars included.
func TestTrimPodReducesOtherPodsToTheirGPUs(t *testing.T) {
	for _, owner := range []metav1.OwnerReference{
		{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", Controller: ptr.To(true)},
		{APIVersion: "batch/v1", Kind: "Job", Name: "adopted-not"},                           // not its controller
		{APIVersion: "training.loom.dev/v1alpha1", Kind: "TrainingJob", Name: "adopted-not"}, // not its controller
		{APIVersion: "example.com/v1", Kind: "RayCluster", Name: "other-group", Controller: ptr.To(true)},
	} {
		p := bigPod(owner)
		o, err := TrimPod(p)
		if err != nil {
			t.Fatal(err)
		}
		got := o.(*corev1.Pod)
		want := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "ns", UID: "u1", ResourceVersion: "7"},
			Spec: corev1.PodSpec{NodeName: "n1",
				InitContainers: []corev1.Container{{Name: "sidecar", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}}}},
				Containers: []corev1.Container{{Name: "main",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodFailed},
		}
		if !apiequality.Semantic.DeepEqual(got, want) {
			t.Errorf("%s/%s: got %+v\nwant %+v", owner.Kind, owner.Name, got, want)
		}
		if inventory.PodGPUs(&got.Spec) != inventory.PodGPUs(&bigPod(owner).Spec) {
			t.Errorf("%s: GPUs changed", owner.Kind)
		}
	}
	// Requests, limits or both, a zero request beside a limit, and a plain
	// init container: the skeleton counts what the pod does.
	q := resource.MustParse
	for _, spec := range []corev1.PodSpec{
		{Containers: []corev1.Container{{Name: "a", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"nvidia.com/gpu": q("3"), "cpu": q("1")}}}}},
		{Containers: []corev1.Container{{Name: "a", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{"nvidia.com/gpu": q("0")}, Limits: corev1.ResourceList{"nvidia.com/gpu": q("1")}}}}},
		{InitContainers: []corev1.Container{{Name: "init", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": q("4")}}}},
			Containers: []corev1.Container{{Name: "a", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": q("2")}}}, {Name: "b"}}},
	} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: *spec.DeepCopy()}
		p.Spec.NodeName = "n"
		before := inventory.PodGPUs(&p.Spec)
		o, _ := TrimPod(p)
		if got := inventory.PodGPUs(&o.(*corev1.Pod).Spec); got != before {
			t.Errorf("%+v: GPUs %d after the trim, %d before", spec, got, before)
		}
	}
	// A pod without GPUs keeps no containers at all.
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{NodeName: "n2",
		Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": resource.MustParse("1")}}}}}}
	o, _ := TrimPod(p)
	if got := o.(*corev1.Pod); got.Spec.Containers != nil || got.Spec.NodeName != "n2" {
		t.Errorf("non-GPU pod: %+v", got.Spec)
	}
}

// Loom's operand pods keep their component and whether they are Ready,
// which the GPU alerts read per node; a DaemonSet pod of someone else's,
// or a pod of Loom's no DaemonSet controls, does not.
func TestTrimPodKeepsWhetherAnOperandIsReady(t *testing.T) {
	ds := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "nvidia-driver-daemonset", Controller: ptr.To(true)}
	operand := func(owner metav1.OwnerReference) *corev1.Pod {
		p := bigPod(owner)
		p.Labels = map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver,
			"controller-revision-hash": "x", gpuv1alpha1.LabelPolicy: "default"}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, Reason: "r", Message: "m"}}
		return p
	}
	o, _ := TrimPod(operand(ds))
	want := gpuSkeleton(operand(ds))
	want.Labels = map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}
	want.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if got := o.(*corev1.Pod); !apiequality.Semantic.DeepEqual(got, want) {
		t.Fatalf("operand pod: got %+v\nwant %+v", got, want)
	}

	foreign := operand(ds)
	foreign.Labels[apply.LabelManagedBy] = "gpu-operator"
	notDS := operand(metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", Controller: ptr.To(true)})
	for _, p := range []*corev1.Pod{foreign, notDS} {
		o, _ := TrimPod(p)
		if got := o.(*corev1.Pod); got.Labels != nil || got.Status.Conditions != nil {
			t.Errorf("%s: kept %v %v", p.OwnerReferences[0].Kind, got.Labels, got.Status.Conditions)
		}
	}
}
