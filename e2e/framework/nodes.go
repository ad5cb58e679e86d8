package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KwokAnnotation marks the nodes kwok simulates.
const KwokAnnotation = "kwok.x-k8s.io/node"

// GPUResource is the extended resource the NVIDIA device plugin advertises.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// NodeSpec describes a group of simulated nodes.
type NodeSpec struct {
	// Prefix names the nodes Prefix-0 .. Prefix-(Count-1).
	Prefix string
	Count  int
	// GPUs per node (nvidia.com/gpu capacity); 0 makes CPU-only nodes.
	GPUs int
	// Product is the GPU model (e.g. NVIDIA-H100-80GB-HBM3), kept as an
	// annotation only: GPU labels are the job of Loom's labeller, from what
	// the (simulated) node agent reports.
	Product string
	CPU     string // default 64
	Memory  string // default 512Gi
	Pods    string // default 110
	Labels  map[string]string
	// Bare is a GPU node as it comes: GPUs on its PCI bus (and NFD's label
	// for them) but no driver and no device plugin yet, so no GPU resource;
	// NodeSim's simulated device plugin advertises it once the stack runs.
	Bare bool
	// OSImage and KernelVersion are the node's status.nodeInfo (default
	// Ubuntu 22.04 on 5.15).
	OSImage, KernelVersion string
}

// CreateNode creates one node named name (spec's Prefix and Count are
// ignored) and waits until kwok reports it Ready.
func (c *Cluster) CreateNode(ctx context.Context, name string, spec NodeSpec) (string, error) {
	if err := c.createNode(ctx, name, spec); err != nil {
		return "", err
	}
	return name, c.WaitNodesReady(ctx, []string{name}, 2*time.Minute)
}

// CreateNodes creates the nodes and waits until kwok reports them Ready.
func (c *Cluster) CreateNodes(ctx context.Context, spec NodeSpec) ([]string, error) {
	names := make([]string, 0, spec.Count)
	for i := range spec.Count {
		name := fmt.Sprintf("%s-%d", spec.Prefix, i)
		if err := c.createNode(ctx, name, spec); err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return names, c.WaitNodesReady(ctx, names, 2*time.Minute)
}

func (c *Cluster) createNode(ctx context.Context, name string, spec NodeSpec) error {
	cpu, mem, pods := orDefault(spec.CPU, "64"), orDefault(spec.Memory, "512Gi"), orDefault(spec.Pods, "110")
	{
		capacity := corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse(cpu),
			corev1.ResourceMemory: resource.MustParse(mem),
			corev1.ResourcePods:   resource.MustParse(pods),
		}
		if spec.GPUs > 0 && !spec.Bare {
			capacity[GPUResource] = *resource.NewQuantity(int64(spec.GPUs), resource.DecimalSI)
		}
		labels := map[string]string{
			"kubernetes.io/hostname": name,
			"kubernetes.io/os":       "linux",
			"kubernetes.io/arch":     "amd64",
			"type":                   "kwok",
		}
		if spec.GPUs > 0 {
			// What node-feature-discovery reports for an NVIDIA PCI device.
			labels["feature.node.kubernetes.io/pci-10de.present"] = "true"
		}
		for k, v := range spec.Labels {
			labels[k] = v
		}
		annotations := map[string]string{KwokAnnotation: "fake", "node.alpha.kubernetes.io/ttl": "0"}
		if spec.Product != "" {
			annotations["loom.dev/simulated-gpu-product"] = spec.Product
		}
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
			Status: corev1.NodeStatus{
				Capacity:    capacity,
				Allocatable: capacity,
				NodeInfo: corev1.NodeSystemInfo{Architecture: "amd64", OperatingSystem: "linux", KubeletVersion: "v1.37.2-kwok",
					OSImage: orDefault(spec.OSImage, "Ubuntu 22.04.4 LTS"), KernelVersion: orDefault(spec.KernelVersion, "5.15.0-105-generic")},
			},
		}
		info := node.Status.NodeInfo // the create drops status
		if err := c.Client.Create(ctx, node); err != nil {
			return fmt.Errorf("creating node %s: %w", name, err)
		}
		// Capacity is status: the create drops it, so set it on the status
		// subresource as a kubelet would.
		// A merge patch, not an update: kwok may already have written the
		// node's conditions.
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": capacity, "nodeInfo": info}})
		if err != nil {
			return err
		}
		if err := c.Client.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return fmt.Errorf("setting capacity of node %s: %w", name, err)
		}
	}
	return nil
}

// WaitNodesReady waits until every named node has Ready=True.
func (c *Cluster) WaitNodesReady(ctx context.Context, names []string, timeout time.Duration) error {
	pending := map[string]bool{}
	for _, n := range names {
		pending[n] = true
	}
	return c.poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		for n := range pending {
			node := &corev1.Node{}
			if err := c.Client.Get(ctx, client.ObjectKey{Name: n}, node); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			if nodeReady(node) {
				delete(pending, n)
			}
		}
		return len(pending) == 0, nil
	}, "nodes Ready ("+strconv.Itoa(len(names))+")")
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}
