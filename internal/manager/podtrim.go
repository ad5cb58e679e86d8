package manager

import (
	corev1 "k8s.io/api/core/v1"
)

// lastApplied is kubectl's copy of a whole object, often the largest
// annotation a pod has.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// TrimPod is the pod cache's transform. Every pod of the cluster is cached
// (the inventory counts GPUs on every node, the driver upgrade drains any
// pod), but the reconcilers read only a pod's metadata, where it runs, its
// resources, volumes' kinds and its status; commands, env, probes, images
// and security settings are most of a pod's size and nobody reads them.
// Nothing writes a cached pod back (deletes and evictions name it), so
// what is dropped here cannot be lost on the server.
func TrimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	p.ManagedFields = nil
	delete(p.Annotations, lastApplied)
	s := &p.Spec
	s.Containers = trimContainers(s.Containers)
	s.InitContainers = trimContainers(s.InitContainers)
	s.EphemeralContainers = nil
	for i := range s.Volumes {
		// Keep the volume's kind only where it matters (emptyDir: a drain
		// must be told to delete its data).
		v := corev1.Volume{Name: s.Volumes[i].Name}
		if s.Volumes[i].EmptyDir != nil {
			v.EmptyDir = &corev1.EmptyDirVolumeSource{}
		}
		s.Volumes[i] = v
	}
	s.Affinity, s.TopologySpreadConstraints, s.SecurityContext = nil, nil, nil
	s.ImagePullSecrets, s.HostAliases, s.DNSConfig, s.ReadinessGates = nil, nil, nil, nil
	st := &p.Status
	st.ContainerStatuses = trimStatuses(st.ContainerStatuses)
	st.InitContainerStatuses = trimStatuses(st.InitContainerStatuses)
	st.EphemeralContainerStatuses = nil
	return p, nil
}

func trimContainers(cs []corev1.Container) []corev1.Container {
	for i, c := range cs {
		cs[i] = corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy, Ports: c.Ports}
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
