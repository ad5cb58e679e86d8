package inventory

// What a pod asks of GPU resources, from its spec: whole GPUs, MIG devices
// and shared replicas, per container and per pod.

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/loom-dev/loom/internal/sharing"
)

// Sidecar: an init container that restarts always (a native sidecar): it
// runs beside the pod's containers, not before them.
func Sidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// UsesGPUs: a container of the pod (init containers and sidecars too) asks
// for a GPU resource: whole GPUs, MIG devices or shared replicas, under
// any of names.
func UsesGPUs(spec *corev1.PodSpec, names sharing.Names) bool {
	asks := func(l corev1.ResourceList) bool {
		for name, q := range l {
			if names.IsGPU(string(name)) && !q.IsZero() {
				return true
			}
		}
		return false
	}
	for _, cs := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
		for i := range cs {
			if asks(cs[i].Resources.Requests) || asks(cs[i].Resources.Limits) {
				return true
			}
		}
	}
	return false
}

// PodGPUs is what a pod takes of nvidia.com/gpu: the larger of its
// containers' total and its largest init container (as the scheduler
// counts), using limits where requests are unset.
func PodGPUs(spec *corev1.PodSpec) int64 { return podResource(spec, GPUResource) }

func podResource(spec *corev1.PodSpec, name corev1.ResourceName) int64 {
	var sum, initMax int64
	get := func(r corev1.ResourceRequirements) int64 { return containerResource(r, name) }
	for i := range spec.Containers {
		sum += get(spec.Containers[i].Resources)
	}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		if Sidecar(c) {
			sum += get(c.Resources) // sidecars run alongside
			continue
		}
		initMax = max(initMax, get(c.Resources))
	}
	return max(sum, initMax)
}

// containerResource is what one container asks of a resource: its
// request, else its limit.
func containerResource(r corev1.ResourceRequirements, name corev1.ResourceName) int64 {
	if q, ok := r.Requests[name]; ok {
		return q.Value()
	}
	if q, ok := r.Limits[name]; ok {
		return q.Value()
	}
	return 0
}

// perContainer is the most one container of the pod (init containers
// included) asks of a resource: the device plugin allocates per container.
func perContainer(spec *corev1.PodSpec, name corev1.ResourceName) int64 {
	var most int64
	for _, cs := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
		for i := range cs {
			most = max(most, containerResource(cs[i].Resources, name))
		}
	}
	return most
}

// podResources is every resource of the pod that is says yes to (PodGPUs
// for each), sorted by name; nil when it asks for none.
func podResources(spec *corev1.PodSpec, is func(string) bool) []resAmount {
	var names []corev1.ResourceName
	add := func(cs []corev1.Container) {
		for i := range cs {
			for _, l := range []corev1.ResourceList{cs[i].Resources.Requests, cs[i].Resources.Limits} {
				for name := range l {
					if is(string(name)) && !slices.Contains(names, name) {
						names = append(names, name)
					}
				}
			}
		}
	}
	add(spec.Containers)
	add(spec.InitContainers)
	slices.Sort(names)
	var out []resAmount
	for _, name := range names {
		if n := podResource(spec, name); n > 0 {
			out = append(out, resAmount{name, n})
		}
	}
	return out
}
