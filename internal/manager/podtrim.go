package manager

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
)

// lastApplied is kubectl's copy of a whole object, often the largest
// annotation a pod has.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// workloadOwners are the kinds whose reconcilers read their pods from the
// cache: they list them by label and act only on those they control. A
// RayJob's submitter pods are kept too (controlledByWorkload).
var workloadOwners = []schema.GroupKind{
	{Group: trainingv1alpha1.GroupVersion.Group, Kind: "TrainingJob"},
	{Group: "ray.io", Kind: "RayCluster"},
}

// TrimPod is the pod cache's transform. Every pod of the cluster is cached
// because the inventory counts the GPUs held on every node, but only the
// pods a TrainingJob or RayCluster controls are read as pods:
//
//   - those keep their metadata, node, containers' names, GPU resources
//     and ports, and their status without images; commands, env, probes,
//     volumes, security settings and CPU and memory requests are most of a
//     pod's size and nobody reads them (a status's desired CPU and memory
//     come from the workload's spec, not its pods);
//   - every other pod (the operands' DaemonSet pods, the cluster's other
//     workloads: nearly all of a big cluster's pods) keeps only its name,
//     node, phase and the GPU resources its containers ask for. The driver upgrade,
//     the one reader of other pods, reads them from the API server.
//
// Nothing writes a cached pod back (deletes and evictions name it), so what
// is dropped here cannot be lost on the server.
func TrimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	if !controlledByWorkload(p) {
		return gpuSkeleton(p), nil
	}
	p.ManagedFields = nil
	delete(p.Annotations, lastApplied)
	s := &p.Spec
	s.Containers = trimContainers(s.Containers)
	s.InitContainers = trimContainers(s.InitContainers)
	s.EphemeralContainers, s.Volumes = nil, nil
	s.Affinity, s.TopologySpreadConstraints, s.SecurityContext = nil, nil, nil
	s.ImagePullSecrets, s.HostAliases, s.DNSConfig, s.ReadinessGates = nil, nil, nil, nil
	s.Tolerations = nil
	st := &p.Status
	st.ContainerStatuses = trimStatuses(st.ContainerStatuses)
	st.InitContainerStatuses = trimStatuses(st.InitContainerStatuses)
	st.EphemeralContainerStatuses = nil
	return p, nil
}

func controlledByWorkload(p *corev1.Pod) bool {
	c := metav1.GetControllerOfNoCopy(p)
	if c == nil {
		return false
	}
	gv, err := schema.ParseGroupVersion(c.APIVersion)
	if err != nil {
		return false
	}
	for _, gk := range workloadOwners {
		if gk.Group == gv.Group && gk.Kind == c.Kind {
			return true
		}
	}
	// A RayJob's submitter pods, which its status quotes while they
	// cannot run; the cluster's other Jobs' pods stay skeletons.
	return gv.Group == "batch" && c.Kind == "Job" && p.Labels[SubmitterPodLabel] == SubmitterPodLabelValue
}

// SubmitterPodLabel, with SubmitterPodLabelValue, marks the pods of a
// RayJob's submitter Job (KubeRay's ray.io/originated-from-crd label):
// the pod cache keeps them whole enough to say why they do not run.
const (
	SubmitterPodLabel      = "ray.io/originated-from-crd"
	SubmitterPodLabelValue = "RayJob"
)

// gpuSkeleton is what the inventory reads of a pod: where it runs, whether
// it has finished, and the GPU requests and limits of its containers (init
// containers with their restart policy, since sidecars hold theirs).
func gpuSkeleton(p *corev1.Pod) *corev1.Pod {
	s := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
			ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp},
	}
	s.Spec.NodeName = p.Spec.NodeName
	s.Spec.Containers = gpuContainers(p.Spec.Containers)
	s.Spec.InitContainers = gpuContainers(p.Spec.InitContainers)
	s.Status.Phase = p.Status.Phase
	return s
}

// gpuContainers keeps the containers that ask for GPU resources
// (nvidia.com/gpu, MIG devices, shared replicas), with only those.
func gpuContainers(cs []corev1.Container) []corev1.Container {
	var out []corev1.Container
	for _, c := range cs {
		req, lim := inventory.NVIDIAResources(c.Resources.Requests), inventory.NVIDIAResources(c.Resources.Limits)
		if req == nil && lim == nil {
			continue
		}
		k := corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy}
		k.Resources.Requests, k.Resources.Limits = req, lim
		out = append(out, k)
	}
	return out
}

func trimContainers(cs []corev1.Container) []corev1.Container {
	for i, c := range cs {
		cs[i] = corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy, Ports: c.Ports}
		cs[i].Resources.Requests = inventory.NVIDIAResources(c.Resources.Requests)
		cs[i].Resources.Limits = inventory.NVIDIAResources(c.Resources.Limits)
	}
	return cs
}

func trimStatuses(cs []corev1.ContainerStatus) []corev1.ContainerStatus {
	for i, c := range cs {
		cs[i] = corev1.ContainerStatus{Name: c.Name, State: c.State, LastTerminationState: c.LastTerminationState,
			Ready: c.Ready, RestartCount: c.RestartCount, Started: c.Started}
	}
	return cs
}
