package kueue

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// A Workload asks for the job's pod sets only while the names, counts and
// every container's requests and limits agree; a request defaulted from
// its limit (the API server's and Kueue's webhook's defaulting) or spelt
// otherwise is the same request.
func TestSamePodSets(t *testing.T) {
	list := func(kv ...string) corev1.ResourceList {
		out := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	set := func(name string, count int32, req, lim corev1.ResourceList, init ...corev1.Container) PodSet {
		return PodSet{Name: name, Count: count, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			InitContainers: init,
			Containers:     []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: req, Limits: lim}}},
		}}}
	}
	job := []PodSet{set("master", 1, list("cpu", "1"), list("nvidia.com/gpu", "8")), set("worker", 2, list("cpu", "1"), list("nvidia.com/gpu", "8"))}
	tests := []struct {
		name string
		have []PodSet
		same bool
	}{
		{"as built", job, true},
		{"requests defaulted from limits", []PodSet{set("master", 1, list("cpu", "1", "nvidia.com/gpu", "8"), list("nvidia.com/gpu", "8")), set("worker", 2, list("cpu", "1000m", "nvidia.com/gpu", "8"), list("nvidia.com/gpu", "8"))}, true},
		{"another count", []PodSet{job[0], set("worker", 3, list("cpu", "1"), list("nvidia.com/gpu", "8"))}, false},
		{"more GPUs", []PodSet{job[0], set("worker", 2, list("cpu", "1"), list("nvidia.com/gpu", "16"))}, false},
		{"another request", []PodSet{job[0], set("worker", 2, list("cpu", "2"), list("nvidia.com/gpu", "8"))}, false},
		{"an init container more", []PodSet{job[0], set("worker", 2, list("cpu", "1"), list("nvidia.com/gpu", "8"), corev1.Container{Name: "fetch"})}, false},
		{"a pod set less", job[:1], false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &Workload{Spec: WorkloadSpec{PodSets: tt.have}}
			if got := w.SamePodSets(job); got != tt.same {
				t.Fatalf("SamePodSets = %v, want %v", got, tt.same)
			}
		})
	}
}
