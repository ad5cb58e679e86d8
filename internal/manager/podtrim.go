package manager

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
)

// lastApplied is kubectl's copy of a whole object, often the largest
// annotation a pod has.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// workloadOwners are the kinds whose reconcilers read their pods from the
// cache: they list them by label and act only on those they control.
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
//   - a batch Job's pods keep, besides the skeleton below, what says why
//     one does not run (jobPod): a RayJob's status quotes its submitter
//     Job's, found by the Job's selector, whichever Loom made the Job;
//   - Loom's operand pods (its DaemonSets' pods, labelled managed-by loom
//     and with their component) keep, besides the skeleton below, those two
//     labels and whether they are Ready: the GPU alerts read, per node,
//     which operands are not ready there (loom_gpunode_operand_not_ready);
//   - every other pod (the cluster's other workloads: nearly all of a big
//     cluster's pods) keeps only its name, node, phase and the GPU
//     resources its containers ask for. The driver upgrade, the one reader
//     of other pods as a whole, reads them from the API server.
//
// Nothing writes a cached pod back (deletes and evictions name it), so what
// is dropped here cannot be lost on the server.
func TrimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	if c := metav1.GetControllerOfNoCopy(p); c != nil && c.Kind == "Job" && strings.HasPrefix(c.APIVersion, "batch/") {
		return jobPod(p, c), nil
	}
	if c := metav1.GetControllerOfNoCopy(p); c != nil && c.Kind == "DaemonSet" && p.Labels[apply.LabelManagedBy] == apply.ManagedBy &&
		p.Labels[gpuv1alpha1.LabelComponent] != "" {
		return operandPod(p), nil
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
	return false
}

// jobPod is a batch Job's pod as the cache keeps it: the skeleton, with
// its controller, the labels the Job controller puts on it (the Job's
// selector is one) and why it waits (unplaced, or a container waiting in
// ImagePullBackOff, CrashLoopBackOff...), which podset.WaitingWhy reads.
// The rest of its status is dropped: the cluster's other Jobs may have
// many pods, and nothing reads them.
func jobPod(p *corev1.Pod, controller *metav1.OwnerReference) *corev1.Pod {
	s := gpuSkeleton(p)
	s.OwnerReferences = []metav1.OwnerReference{*controller}
	for k, v := range p.Labels {
		if strings.HasPrefix(k, batchLabelPrefix) || k == "controller-uid" || k == "job-name" {
			if s.Labels == nil {
				s.Labels = map[string]string{}
			}
			s.Labels[k] = v
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			s.Status.Conditions = append(s.Status.Conditions, corev1.PodCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
		}
	}
	s.Status.InitContainerStatuses = waiting(p.Status.InitContainerStatuses)
	s.Status.ContainerStatuses = waiting(p.Status.ContainerStatuses)
	return s
}

// operandPod is one of Loom's operand pods as the cache keeps it: the
// skeleton, its component and managed-by labels and its Ready condition.
func operandPod(p *corev1.Pod) *corev1.Pod {
	s := gpuSkeleton(p)
	s.Labels = map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: p.Labels[gpuv1alpha1.LabelComponent]}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			s.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return s
}

// batchLabelPrefix is that of the labels the Job controller puts on its
// pods (batch.kubernetes.io/controller-uid, job-name; before Kubernetes
// 1.27, controller-uid and job-name alone).
const batchLabelPrefix = "batch.kubernetes.io/"

// waiting is the containers that wait, with only their name and why.
func waiting(cs []corev1.ContainerStatus) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	for _, c := range cs {
		if c.State.Waiting != nil {
			out = append(out, corev1.ContainerStatus{Name: c.Name, State: corev1.ContainerState{Waiting: c.State.Waiting}})
		}
	}
	return out
}

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
