package gang

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func container(name string, req, lim corev1.ResourceList) corev1.Container {
	return corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Requests: req, Limits: lim}}
}

func TestPodRequests(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	tests := []struct {
		name string
		spec corev1.PodSpec
		want corev1.ResourceList
	}{
		{"limits only count as requests (GPUs are usually set so)",
			corev1.PodSpec{Containers: []corev1.Container{container("a", nil, rl("nvidia.com/gpu", "8", "cpu", "4"))}},
			rl("nvidia.com/gpu", "8", "cpu", "4")},
		{"containers add up",
			corev1.PodSpec{Containers: []corev1.Container{container("a", rl("cpu", "1", "memory", "1Gi"), nil), container("b", rl("cpu", "500m"), nil)}},
			rl("cpu", "1500m", "memory", "1Gi")},
		{"an init container's peak wins when larger",
			corev1.PodSpec{InitContainers: []corev1.Container{container("init", rl("cpu", "8"), nil)}, Containers: []corev1.Container{container("a", rl("cpu", "1"), nil)}},
			rl("cpu", "8")},
		{"a sidecar (restartable init container) adds to the containers",
			corev1.PodSpec{InitContainers: []corev1.Container{{Name: "side", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Requests: rl("cpu", "250m")}}},
				Containers: []corev1.Container{container("a", rl("cpu", "1"), rl("nvidia.com/gpu", "1"))}},
			rl("cpu", "1250m", "nvidia.com/gpu", "1")},
		{"overhead is added",
			corev1.PodSpec{Overhead: rl("cpu", "100m"), Containers: []corev1.Container{container("a", rl("cpu", "1"), nil)}},
			rl("cpu", "1100m")},
		{"requests win over limits",
			corev1.PodSpec{Containers: []corev1.Container{container("a", rl("cpu", "1"), rl("cpu", "2"))}},
			rl("cpu", "1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PodRequests(&tt.spec)
			if !equal(got, tt.want) {
				t.Fatalf("PodRequests = %v, want %v", got, tt.want)
			}
		})
	}
	if got := PodRequests(nil); len(got) != 0 {
		t.Fatalf("PodRequests(nil) = %v", got)
	}
}

func TestPodRequestsDoesNotModifyTheSpec(t *testing.T) {
	spec := corev1.PodSpec{Containers: []corev1.Container{container("a", nil, rl("nvidia.com/gpu", "8"))}}
	PodRequests(&spec)
	if spec.Containers[0].Resources.Requests != nil {
		t.Fatalf("PodRequests wrote requests into the caller's spec: %v", spec.Containers[0].Resources.Requests)
	}
}

func equal(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, q := range a {
		if w, ok := b[k]; !ok || q.Cmp(w) != 0 {
			return false
		}
	}
	return true
}

func TestPodGroup(t *testing.T) {
	master := corev1.PodSpec{Containers: []corev1.Container{container("pytorch", rl("cpu", "2", "memory", "8Gi"), rl("nvidia.com/gpu", "8"))}}
	worker := master
	owner := metav1.OwnerReference{APIVersion: "training.loom.dev/v1alpha1", Kind: "TrainingJob", Name: "llm", UID: "u1"}
	tests := []struct {
		name          string
		workerMin     int32
		wantMin       int32
		wantTask      map[string]int32
		wantResources corev1.ResourceList
	}{
		{"every pod", 3, 4, map[string]int32{"master": 1, "worker": 3}, rl("cpu", "8", "memory", "32Gi", "nvidia.com/gpu", "32")},
		{"master plus one worker", 1, 2, map[string]int32{"master": 1, "worker": 1}, rl("cpu", "4", "memory", "16Gi", "nvidia.com/gpu", "16")},
		{"master alone", 0, 1, map[string]int32{"master": 1}, rl("cpu", "2", "memory", "8Gi", "nvidia.com/gpu", "8")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pg := PodGroup(Spec{
				Name: "llm", Namespace: "ml", Owner: owner, Queue: "research", PriorityClassName: "high",
				Labels: map[string]string{"a": "b"},
				Tasks:  []Task{{Name: "master", Count: 1, Min: 1, Spec: &master}, {Name: "worker", Count: 3, Min: tt.workerMin, Spec: &worker}},
			})
			if pg.Name != "llm" || pg.Namespace != "ml" || pg.Spec.Queue != "research" || pg.Spec.PriorityClassName != "high" || pg.Labels["a"] != "b" {
				t.Fatalf("metadata/queue/priority wrong: %+v", pg)
			}
			if len(pg.OwnerReferences) != 1 || pg.OwnerReferences[0].UID != "u1" {
				t.Fatalf("owner = %v", pg.OwnerReferences)
			}
			if pg.Spec.MinMember != tt.wantMin {
				t.Fatalf("minMember = %d, want %d", pg.Spec.MinMember, tt.wantMin)
			}
			if len(pg.Spec.MinTaskMember) != len(tt.wantTask) {
				t.Fatalf("minTaskMember = %v, want %v", pg.Spec.MinTaskMember, tt.wantTask)
			}
			for k, v := range tt.wantTask {
				if pg.Spec.MinTaskMember[k] != v {
					t.Fatalf("minTaskMember = %v, want %v", pg.Spec.MinTaskMember, tt.wantTask)
				}
			}
			if pg.Spec.MinResources == nil || !equal(*pg.Spec.MinResources, tt.wantResources) {
				t.Fatalf("minResources = %v, want %v", pg.Spec.MinResources, tt.wantResources)
			}
		})
	}
}

func TestPodGroupLargeGangIsExact(t *testing.T) {
	spec := corev1.PodSpec{Containers: []corev1.Container{container("c", rl("cpu", "100m", "memory", "1536Mi"), rl("nvidia.com/gpu", "8"))}}
	pg := PodGroup(Spec{Name: "g", Tasks: []Task{{Name: "worker", Count: 9999, Min: 9999, Spec: &spec}}})
	want := rl("cpu", "999900m", "memory", "15358464Mi", "nvidia.com/gpu", "79992")
	if !equal(*pg.Spec.MinResources, want) {
		t.Fatalf("minResources = %v, want %v", *pg.Spec.MinResources, want)
	}
}

func TestJoin(t *testing.T) {
	pod := &corev1.Pod{}
	Join(pod, "llm", "worker")
	if pod.Spec.SchedulerName != "volcano" || pod.Annotations[GroupNameAnnotation] != "llm" || pod.Annotations[TaskSpecAnnotation] != "worker" {
		t.Fatalf("Join: %+v", pod)
	}
}

// FuzzPodRequests: any quantities give a result no smaller than each
// container's request, and never panic.
func FuzzPodRequests(f *testing.F) {
	f.Add(int64(1000), int64(500), int64(8), int64(2000), true)
	f.Add(int64(0), int64(0), int64(0), int64(0), false)
	f.Fuzz(func(t *testing.T, a, b, gpus, init int64, sidecar bool) {
		if a < 0 || b < 0 || gpus < 0 || init < 0 || a > 1e12 || b > 1e12 || init > 1e12 || gpus > 1e6 {
			return
		}
		var rp *corev1.ContainerRestartPolicy
		if sidecar {
			always := corev1.ContainerRestartPolicyAlways
			rp = &always
		}
		spec := corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "i", RestartPolicy: rp, Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(init, resource.DecimalSI)}}}},
			Containers: []corev1.Container{
				{Name: "a", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(a, resource.DecimalSI)}, Limits: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)}}},
				{Name: "b", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(b, resource.DecimalSI)}}},
			},
		}
		got := PodRequests(&spec)
		cpu := got[corev1.ResourceCPU]
		if cpu.MilliValue() < max(a+b, init) {
			t.Fatalf("cpu %v below max(containers %d, init %d)", cpu.String(), a+b, init)
		}
		g := got["nvidia.com/gpu"]
		if g.Value() != gpus {
			t.Fatalf("gpus = %v, want %d", g.String(), gpus)
		}
		pg := PodGroup(Spec{Name: "g", Tasks: []Task{{Name: "w", Count: 3, Min: 3, Spec: &spec}}})
		if pg.Spec.MinResources != nil {
			pgGPU := (*pg.Spec.MinResources)["nvidia.com/gpu"]
			if pgGPU.Value() != 3*gpus {
				t.Fatalf("PodGroup GPUs = %v, want %d", pgGPU.String(), 3*gpus)
			}
		}
	})
}
