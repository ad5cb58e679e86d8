package nodelabels

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

// NFDPresenceLabels are node feature discovery's labels of a node with an
// NVIDIA PCI device, in the three forms GPU Operator accepts.
var NFDPresenceLabels = []string{gpuv1alpha1.LabelNFDPCINVIDIA, gpuv1alpha1.LabelNFDPCI3DNVIDIA, gpuv1alpha1.LabelNFDPCIDisplayNVIDIA}

// sharedSuffix is what GFD appends to gpu.product when nvidia.com/gpu is
// shared under its own name.
const sharedSuffix = "-SHARED"

// Input is what one node's labels are computed from.
type Input struct {
	// GPUNode is the node's GPUNode status; nil when it has none yet.
	GPUNode *gpuv1alpha1.GPUNodeStatus
	// NodeLabels are the Node's labels now: NFD's, and those the labeller
	// set before.
	NodeLabels map[string]string
	// Managed are the keys of the labels the labeller set before.
	Managed []string
	// MIGStrategy of the policy in force; "" without one.
	MIGStrategy string
	// Sharing is the node's device plugin config; nil when it cannot be
	// read (the sharing labels the node has are then kept).
	Sharing *sharing.Node
	// LoomDriverReady: a driver pod of Loom's on the node is ready (read
	// only where HostDriver holds).
	LoomDriverReady bool
}

// Desired computes a node's labels:
//   - with NVML GPUs on the GPUNode (the agent keeps its last good GPUs
//     while NVML is unavailable), GFD's full set (LabelsFor) and the
//     sharing labels of nvidia.com/gpu under the node's config;
//   - with only PCI devices (no NVML yet), gpu.present, gpu.count and, when
//     PCI names the product, gpu.product;
//   - with neither but NVML unavailable, the labels the labeller set
//     before, unchanged: an NVML failure never takes a label away (a key
//     in the record that the labeller never sets, the record edited or
//     copied by hand, is left to its owner, not taken over);
//   - and gpu.present=true whenever one of NFD's NVIDIA PCI labels is, also
//     on a node without a GPUNode: that is how the driver reaches a bare
//     node.
func Desired(in Input) map[string]string {
	st := in.GPUNode
	l := map[string]string{}
	switch {
	case st == nil:
	case len(st.GPUs) > 0:
		l = LabelsFor(*st, in.MIGStrategy)
		sharingLabels(l, in)
	case len(st.PCIDevices) > 0:
		l = PCILabels(st.PCIDevices)
	case nvmlUnavailable(st):
		for _, k := range in.Managed {
			if v, ok := in.NodeLabels[k]; ok && labellerKey(k) {
				l[k] = v
			}
		}
	}
	if NFDPresent(in.NodeLabels) {
		l[gpuv1alpha1.LabelPresent] = "true"
	}
	preInstalled(l, in)
	return l
}

// labellerKeys are the node labels the labeller sets, besides the MIG
// profiles' (labellerKey).
var labellerKeys = []string{gpuv1alpha1.LabelPresent, gpuv1alpha1.LabelCount, gpuv1alpha1.LabelProduct, gpuv1alpha1.LabelMemory,
	gpuv1alpha1.LabelFamily, gpuv1alpha1.LabelComputeMajor, gpuv1alpha1.LabelComputeMinor, gpuv1alpha1.LabelReplicas,
	gpuv1alpha1.LabelSharingStrategy, gpuv1alpha1.LabelMIGCapable, gpuv1alpha1.LabelMIGStrategy,
	gpuv1alpha1.LabelDriverMajor, gpuv1alpha1.LabelDriverMinor, gpuv1alpha1.LabelDriverRevision, gpuv1alpha1.LabelDriverFull,
	gpuv1alpha1.LabelRuntimeMajor, gpuv1alpha1.LabelRuntimeMinor, gpuv1alpha1.LabelRuntimeFull, gpuv1alpha1.LabelDeployDriver}

// labellerKey reports whether k is a label the labeller may set: one of
// labellerKeys or a MIG profile's nvidia.com/mig-<profile>.{count,memory}.
// Others under nvidia.com/ (mig.config, device-plugin.config, GPU
// Operator's gpu.deploy.* switches) are people's and tools'.
func labellerKey(k string) bool {
	if slices.Contains(labellerKeys, k) {
		return true
	}
	p, ok := strings.CutPrefix(k, gpuv1alpha1.LabelPrefix+"mig-")
	return ok && p != "" && (strings.HasSuffix(p, ".count") || strings.HasSuffix(p, ".memory"))
}

// HostDriver reports whether the node is to be labelled
// nvidia.com/gpu.deploy.driver=pre-installed as far as its GPUNode and its
// labels tell: its agent reads the GPUs through the host's own driver
// (NVML available now) and the node has no value of the label. The
// labeller then checks that no driver pod of Loom's on it is ready: a
// driver container loads its driver into the host's kernel, and the label
// would take it away.
func HostDriver(in Input) bool {
	st := in.GPUNode
	_, labelled := in.NodeLabels[gpuv1alpha1.LabelDeployDriver]
	return !labelled && driverFrom(st, gpuv1alpha1.DriverHost) && !nvmlUnavailable(st)
}

// preInstalled sets nvidia.com/gpu.deploy.driver=pre-installed, which keeps
// Loom's driver off the node, where HostDriver holds and no driver pod of
// Loom's is ready (one that never gets ready on a host whose driver holds
// the GPUs is what the label is for: the DaemonSet controller then deletes
// it), as GPU Operator's driver manager labels a host with a driver of its
// own. The labeller's own label stays while NVML is unavailable or the
// GPUNode is gone (a driver container must not land on the host's driver
// for that), until the node's driver is a container's; a value anyone else
// set is never touched, and a removed one is set again while the host's
// driver is in use: nvidia.com/gpu.deploy.driver=true is how a person asks
// for Loom's driver there anyway.
func preInstalled(l map[string]string, in Input) {
	k := gpuv1alpha1.LabelDeployDriver
	delete(l, k) // kept above among the managed labels; decided here
	ours := in.NodeLabels[k] == gpuv1alpha1.DeployDriverPreInstalled && slices.Contains(in.Managed, k)
	if (ours && !driverFrom(in.GPUNode, gpuv1alpha1.DriverContainer)) || (HostDriver(in) && !in.LoomDriverReady) {
		l[k] = gpuv1alpha1.DeployDriverPreInstalled
	}
}

// driverFrom reports whether the GPUNode status says its driver comes from
// src.
func driverFrom(st *gpuv1alpha1.GPUNodeStatus, src gpuv1alpha1.DriverSource) bool {
	return st != nil && st.Driver != nil && st.Driver.Source == src
}

// NFDPresent reports whether one of NFD's NVIDIA PCI labels is "true".
func NFDPresent(labels map[string]string) bool {
	for _, k := range NFDPresenceLabels {
		if labels[k] == "true" {
			return true
		}
	}
	return false
}

func nvmlUnavailable(st *gpuv1alpha1.GPUNodeStatus) bool {
	return apimeta.IsStatusConditionTrue(st.Conditions, gpuv1alpha1.ConditionNVMLUnavailable)
}

// PCILabels are the labels of GPUs seen on the PCI bus only: presence, the
// count, and the product when PCI names it ("mixed" when the devices
// differ).
func PCILabels(devs []gpuv1alpha1.PCIDevice) map[string]string {
	l := map[string]string{
		gpuv1alpha1.LabelPresent: "true",
		gpuv1alpha1.LabelCount:   strconv.Itoa(len(devs)),
	}
	product := ""
	for _, d := range devs {
		switch {
		case d.Product == "":
		case product == "":
			product = d.Product
		case product != d.Product:
			product = "mixed"
		}
	}
	if v := LabelValue(product); v != "" {
		l[gpuv1alpha1.LabelProduct] = v
	}
	return l
}

// sharingLabels sets nvidia.com/gpu's replicas, sharing strategy and
// product suffix as GFD does: replicas 1 and strategy none unless shared,
// and -SHARED on the product when shared under its own name (a renamed
// resource leaves the product alone). Without a readable config, the
// node's current values stay.
func sharingLabels(l map[string]string, in Input) {
	if in.Sharing == nil {
		keepSharingLabels(l, in.NodeLabels)
		return
	}
	r := in.Sharing.Resource(sharing.GPUResource)
	l[gpuv1alpha1.LabelReplicas] = strconv.Itoa(r.Replicas)
	l[gpuv1alpha1.LabelSharingStrategy] = string(r.Strategy)
	// A product NVML names with nothing a label value keeps has no label
	// to suffix ("-SHARED" alone is no valid value).
	if p := l[gpuv1alpha1.LabelProduct]; r.Shared() && !r.Renamed() && p != "" && !strings.HasSuffix(p, migInvalidSuffix) {
		l[gpuv1alpha1.LabelProduct] = sharedProduct(p)
	}
}

// keepSharingLabels leaves the node's sharing labels as they are.
func keepSharingLabels(l, node map[string]string) {
	for _, k := range []string{gpuv1alpha1.LabelReplicas, gpuv1alpha1.LabelSharingStrategy} {
		if v, ok := node[k]; ok {
			l[k] = v
		} else {
			delete(l, k)
		}
	}
	if p := l[gpuv1alpha1.LabelProduct]; p != "" && node[gpuv1alpha1.LabelProduct] == sharedProduct(p) {
		l[gpuv1alpha1.LabelProduct] = node[gpuv1alpha1.LabelProduct]
	}
}

// sharedProduct is product with GFD's -SHARED suffix.
func sharedProduct(product string) string { return withSuffix(product, sharedSuffix) }

// UnhealthyTaint is the taint a node gets while a GPU of its GPUNode is
// unhealthy and the policy asks for it: nvidia.com/gpu.unhealthy=<the
// reason of the first unhealthy GPU>:NoSchedule. nil: no taint.
func UnhealthyTaint(st *gpuv1alpha1.GPUNodeStatus, enabled bool) *corev1.Taint {
	if !enabled || st == nil {
		return nil
	}
	for _, g := range st.GPUs {
		if g.Health.State != gpuv1alpha1.GPUUnhealthy {
			continue
		}
		reason := LabelValue(g.Health.Reason)
		if reason == "" {
			reason = string(gpuv1alpha1.GPUUnhealthy)
		}
		return &corev1.Taint{Key: gpuv1alpha1.TaintUnhealthy, Value: reason, Effect: corev1.TaintEffectNoSchedule}
	}
	return nil
}

// WithTaint is taints with the nvidia.com/gpu.unhealthy:NoSchedule taint
// replaced by want (removed when want is nil); every other taint stays, in
// order, one of the key with another effect included.
func WithTaint(taints []corev1.Taint, want *corev1.Taint) []corev1.Taint {
	out := make([]corev1.Taint, 0, len(taints)+1)
	for _, t := range taints {
		if !gpuv1alpha1.IsUnhealthyTaint(t) {
			out = append(out, t)
		}
	}
	if want != nil {
		out = append(out, *want)
	}
	return out
}

// loomTaint is the nvidia.com/gpu.unhealthy:NoSchedule taint of taints,
// nil when there is none.
func loomTaint(taints []corev1.Taint) *corev1.Taint {
	for i := range taints {
		if gpuv1alpha1.IsUnhealthyTaint(taints[i]) {
			return &taints[i]
		}
	}
	return nil
}
