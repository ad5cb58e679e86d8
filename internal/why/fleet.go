package why

import (
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

// FleetNode is one GPU node of `kubectl loom gpus`.
type FleetNode struct {
	Name    string `json:"name"`
	Product string `json:"product,omitempty"`
	// GPUs is the number of physical GPUs (the GPUNode's count, else the
	// nvidia.com/gpu.count label).
	GPUs int32 `json:"gpus"`
	// Unhealthy lists the node's unhealthy GPUs (from its GPUNode).
	Unhealthy []string `json:"unhealthy,omitempty"`
	// MIGConfig and MIGState are the nvidia.com/mig.config layout and the
	// MIG manager's nvidia.com/mig.config.state.
	MIGConfig string `json:"migConfig,omitempty"`
	MIGState  string `json:"migState,omitempty"`
	// Schedulable is false for a cordoned node.
	Schedulable bool `json:"schedulable"`
	// Resources are the node's GPU resources, by name.
	Resources []ResourceUse `json:"resources"`
}

// ResourceUse is one GPU resource of a node.
type ResourceUse struct {
	Name string `json:"name"`
	// Allocatable is what the node offers (the device plugin's count).
	Allocatable int64 `json:"allocatable"`
	// Allocated is the sum of the requests of the non-terminal pods bound
	// to the node.
	Allocated int64 `json:"allocated"`
	// Free is allocatable less allocated (never below 0).
	Free int64 `json:"free"`
	// Pods are namespace/name=count of the pods holding it.
	Pods []string `json:"pods,omitempty"`
}

// IsGPUNode: the node has a GPU resource (names.IsGPU: a NIC's
// nvidia.com/rdma_shared is not one), the nvidia.com/gpu.present label or
// a GPUNode.
func IsGPUNode(node *corev1.Node, hasGPUNode bool, names sharing.Names) bool {
	return hasGPUNode || node.Labels[gpuv1alpha1.LabelPresent] == "true" ||
		len(gpuResources(node.Status.Allocatable, names)) > 0 || len(gpuResources(node.Status.Capacity, names)) > 0
}

// gpuResources are the GPU resource names of a list, sorted.
func gpuResources(l corev1.ResourceList, names sharing.Names) []corev1.ResourceName {
	var out []corev1.ResourceName
	for r := range l {
		if names.IsGPU(string(r)) {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Fleet is one FleetNode per GPU node, sorted by name, from the nodes,
// their GPUNodes and the pods bound to nodes (terminal pods are skipped).
// names are the GPU resources of the cluster's sharing configs.
func Fleet(nodes []corev1.Node, gpuNodes []gpuv1alpha1.GPUNode, pods []corev1.Pod, names sharing.Names) []FleetNode {
	gns := make(map[string]*gpuv1alpha1.GPUNode, len(gpuNodes))
	for i := range gpuNodes {
		gns[gpuNodes[i].Name] = &gpuNodes[i]
	}
	holders := podsByNode(pods, names)
	out := make([]FleetNode, 0, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		gn := gns[n.Name]
		if !IsGPUNode(n, gn != nil, names) {
			continue
		}
		out = append(out, fleetNode(n, gn, holders[n.Name], names))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// podUse is one pod's GPU requests.
type podUse struct {
	name     string
	requests corev1.ResourceList
}

func podsByNode(pods []corev1.Pod, names sharing.Names) map[string][]podUse {
	out := map[string][]podUse{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		req := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
		gpus := corev1.ResourceList{}
		for _, r := range gpuResources(req, names) {
			if q := req[r]; !q.IsZero() {
				gpus[r] = q
			}
		}
		if len(gpus) > 0 {
			out[p.Spec.NodeName] = append(out[p.Spec.NodeName], podUse{name: p.Namespace + "/" + p.Name, requests: gpus})
		}
	}
	return out
}

func fleetNode(n *corev1.Node, gn *gpuv1alpha1.GPUNode, pods []podUse, names sharing.Names) FleetNode {
	f := FleetNode{Name: n.Name, Product: n.Labels[gpuv1alpha1.LabelProduct], Schedulable: !n.Spec.Unschedulable,
		MIGConfig: n.Labels[gpuv1alpha1.LabelMIGConfig], MIGState: n.Labels[gpuv1alpha1.LabelMIGConfigState]}
	if gn != nil {
		f.GPUs = gn.Status.GPUCount
		if f.Product == "" {
			f.Product = gn.Status.Product
		}
		f.Unhealthy = UnhealthyGPUs(gn)
	} else if c, err := strconv.ParseInt(n.Labels[gpuv1alpha1.LabelCount], 10, 32); err == nil {
		f.GPUs = int32(c)
	}
	res := map[corev1.ResourceName]bool{}
	for _, r := range gpuResources(n.Status.Allocatable, names) {
		res[r] = true
	}
	for _, p := range pods {
		for r := range p.requests {
			res[r] = true
		}
	}
	for _, r := range sortedNames(res) {
		q := n.Status.Allocatable[r]
		u := ResourceUse{Name: string(r), Allocatable: q.Value()}
		for _, p := range pods {
			if v, ok := p.requests[r]; ok {
				u.Allocated += v.Value()
				u.Pods = append(u.Pods, p.name+"="+v.String())
			}
		}
		u.Free = max(u.Allocatable-u.Allocated, 0)
		sort.Strings(u.Pods)
		f.Resources = append(f.Resources, u)
	}
	return f
}

func sortedNames(m map[corev1.ResourceName]bool) []corev1.ResourceName {
	out := make([]corev1.ResourceName, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
