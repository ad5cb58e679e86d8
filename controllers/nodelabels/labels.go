// Package nodelabels is the GPU node labeller: it turns each GPUNode's
// inventory into GPU feature discovery's labels on its Node, shaped by the
// MIG strategy and the device plugin's sharing config of the ClusterPolicy
// in force; marks nodes whose PCI bus (or NFD) shows NVIDIA GPUs present
// before any driver runs; taints nodes with unhealthy GPUs when the policy
// asks; and makes each Node the owner of its GPUNode.
package nodelabels

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/sharing"
)

// Labels computes the Node labels for a GPUNode's status. A node without
// GPUs gets none: the labeller then removes what it set before.
//
// Without a ClusterPolicy the MIG strategy is "mixed" on nodes with MIG
// devices (one nvidia.com/mig-<profile>.count label per profile) and "none"
// elsewhere. GFD's nvidia.com/gfd.timestamp is deliberately left out: it
// would turn every collection into a Node write.
func Labels(st gpuv1alpha1.GPUNodeStatus) map[string]string { return LabelsFor(st, "") }

// LabelsFor computes the labels under a ClusterPolicy's MIG strategy, as
// GFD does:
//   - none: MIG devices are not advertised;
//   - mixed: one nvidia.com/mig-<profile>.{count,memory} pair per profile;
//   - single: the node's MIG devices stand in for its GPUs:
//     nvidia.com/gpu.product=<product>-MIG-<profile>, gpu.count and
//     gpu.memory of the devices; a node mixing profiles is labelled
//     <product>-MIG-INVALID with count 0, so nothing lands on it by mistake.
//
// "" is the no-policy behaviour of Labels.
func LabelsFor(st gpuv1alpha1.GPUNodeStatus, strategy string) map[string]string {
	if len(st.GPUs) == 0 {
		return map[string]string{}
	}
	l := gpuLabels(st)
	capable, mig := migDevices(st.GPUs)
	l[gpuv1alpha1.LabelMIGCapable] = strconv.FormatBool(capable)
	if strategy == "" {
		strategy = string(gpuv1alpha1.MIGStrategyNone)
		if len(mig) > 0 {
			strategy = string(gpuv1alpha1.MIGStrategyMixed)
		}
	}
	l[gpuv1alpha1.LabelMIGStrategy] = strategy
	switch {
	case strategy == string(gpuv1alpha1.MIGStrategyNone):
	case strategy == string(gpuv1alpha1.MIGStrategySingle):
		// A GPU in MIG mode makes the node a MIG node, with or without
		// MIG devices yet.
		if anyInMIGMode(st.GPUs) {
			singleMIGLabels(l, mig, allInMIGMode(st.GPUs))
		}
	case len(mig) > 0:
		mixedMIGLabels(l, mig)
	}
	versionLabels(l, st)
	for k, v := range l {
		if v == "" {
			delete(l, k)
		}
	}
	return l
}

// gpuLabels are the labels of the node's GPUs themselves (its first GPU
// stands for all of them; a mixed node's product is "mixed").
func gpuLabels(st gpuv1alpha1.GPUNodeStatus) map[string]string {
	first := st.GPUs[0]
	l := map[string]string{
		gpuv1alpha1.LabelPresent:  "true",
		gpuv1alpha1.LabelCount:    strconv.Itoa(len(st.GPUs)),
		gpuv1alpha1.LabelProduct:  LabelValue(first.Product),
		gpuv1alpha1.LabelReplicas: "1",
		// Unshared until the node's device plugin config says otherwise
		// (see Desired).
		gpuv1alpha1.LabelSharingStrategy: string(sharing.StrategyNone),
	}
	if first.MemoryMiB > 0 {
		l[gpuv1alpha1.LabelMemory] = strconv.FormatInt(first.MemoryMiB, 10)
	}
	if st.Product == "mixed" {
		l[gpuv1alpha1.LabelProduct] = "mixed"
	}
	if first.Architecture != "" {
		l[gpuv1alpha1.LabelFamily] = LabelValue(strings.ToLower(first.Architecture))
	}
	if major, minor, ok := strings.Cut(first.ComputeCapability, "."); ok {
		l[gpuv1alpha1.LabelComputeMajor], l[gpuv1alpha1.LabelComputeMinor] = LabelValue(major), LabelValue(minor)
	}
	return l
}

// migProfile is the MIG devices of one profile on a node.
type migProfile struct{ count, memoryMiB int64 }

// migDevices reports whether any GPU is MIG-capable and counts the
// devices of the GPUs in MIG mode by profile.
func migDevices(gpus []gpuv1alpha1.GPU) (bool, map[string]migProfile) {
	capable, mig := false, map[string]migProfile{}
	for _, g := range gpus {
		if g.MIG == nil {
			continue
		}
		capable = capable || g.MIG.Capable
		if g.MIG.CurrentMode != gpuv1alpha1.MIGEnabled {
			continue
		}
		for _, d := range g.MIG.Devices {
			mig[d.Profile] = migProfile{mig[d.Profile].count + 1, d.MemoryMiB}
		}
	}
	return capable, mig
}

// allInMIGMode: every GPU of the node is in MIG mode.
func allInMIGMode(gpus []gpuv1alpha1.GPU) bool {
	for _, g := range gpus {
		if g.MIG == nil || g.MIG.CurrentMode != gpuv1alpha1.MIGEnabled {
			return false
		}
	}
	return true
}

// anyInMIGMode: some GPU of the node is in MIG mode.
func anyInMIGMode(gpus []gpuv1alpha1.GPU) bool {
	for _, g := range gpus {
		if g.MIG != nil && g.MIG.CurrentMode == gpuv1alpha1.MIGEnabled {
			return true
		}
	}
	return false
}

// singleMIGLabels makes the MIG devices stand in for the GPUs. As NVIDIA's
// device plugin and GPU feature discovery have it, the single strategy
// needs one profile on every GPU: a node with two profiles, with no MIG
// devices at all, or with MIG on only some of its GPUs (uniform false), is
// <product>-MIG-INVALID with no GPUs.
func singleMIGLabels(l map[string]string, mig map[string]migProfile, uniform bool) {
	if len(mig) != 1 || !uniform {
		l[gpuv1alpha1.LabelProduct] = withSuffix(l[gpuv1alpha1.LabelProduct], migInvalidSuffix)
		l[gpuv1alpha1.LabelCount] = "0"
		return
	}
	for profile, p := range mig {
		l[gpuv1alpha1.LabelProduct] = withSuffix(l[gpuv1alpha1.LabelProduct], "-MIG-"+LabelValue(profile))
		l[gpuv1alpha1.LabelCount] = strconv.FormatInt(p.count, 10)
		if p.memoryMiB > 0 {
			l[gpuv1alpha1.LabelMemory] = strconv.FormatInt(p.memoryMiB, 10)
		}
	}
}

// mixedMIGLabels adds one nvidia.com/mig-<profile>.{count,memory} pair per
// profile, named as the device plugin's resource (a '+' written '.':
// nvidia.com/mig-1g.10gb.me.count).
func mixedMIGLabels(l map[string]string, mig map[string]migProfile) {
	// Profiles that make one label (they differ only past its length or in
	// what a label cannot hold) add up, the first by name giving the
	// memory: whatever the map's order, the labels are the same.
	for _, profile := range slices.Sorted(maps.Keys(mig)) {
		m := mig[profile]
		p := LabelValue(inventory.MIGProfileName(profile))
		if len(p) > 52 {
			p = LabelValue(p[:52])
		}
		if p == "" {
			continue
		}
		count := gpuv1alpha1.LabelPrefix + "mig-" + p + ".count"
		if n, err := strconv.ParseInt(l[count], 10, 64); err == nil {
			l[count] = strconv.FormatInt(n+m.count, 10)
			continue
		}
		l[count] = strconv.FormatInt(m.count, 10)
		if m.memoryMiB > 0 {
			l[gpuv1alpha1.LabelPrefix+"mig-"+p+".memory"] = strconv.FormatInt(m.memoryMiB, 10)
		}
	}
}

// versionLabels adds the driver's and CUDA's versions.
func versionLabels(l map[string]string, st gpuv1alpha1.GPUNodeStatus) {
	if parts := strings.Split(st.DriverVersion, "."); len(parts) >= 2 {
		l[gpuv1alpha1.LabelDriverMajor], l[gpuv1alpha1.LabelDriverMinor] = LabelValue(parts[0]), LabelValue(parts[1])
		if len(parts) >= 3 {
			l[gpuv1alpha1.LabelDriverRevision] = LabelValue(parts[2])
		}
		l[gpuv1alpha1.LabelDriverFull] = LabelValue(st.DriverVersion)
	}
	if major, minor, ok := strings.Cut(st.CUDADriverVersion, "."); ok {
		l[gpuv1alpha1.LabelRuntimeMajor], l[gpuv1alpha1.LabelRuntimeMinor] = LabelValue(major), LabelValue(minor)
		l[gpuv1alpha1.LabelRuntimeFull] = LabelValue(st.CUDADriverVersion)
	}
}

// migInvalidSuffix marks the product of a node the single strategy cannot
// use.
const migInvalidSuffix = "-MIG-INVALID"

// withSuffix is product (a label value) with suffix, within a label value's
// 63 characters: the product is cut, never the suffix, which is what tells
// a MIG, invalid or shared node's product from a plain one.
func withSuffix(product, suffix string) string {
	if room := max(validation.LabelValueMaxLength-len(suffix), 0); len(product) > room {
		product = strings.TrimRight(product[:room], "-_.")
	}
	return LabelValue(product + suffix)
}

// LabelValue makes s a valid label value the way GFD does for product
// names (spaces become '-').
func LabelValue(s string) string { return inventory.LabelValue(s) }
