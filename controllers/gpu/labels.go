// Package gpu holds the reconcilers of the GPU stack: for now the labeller
// that turns each GPUNode's inventory into GPU-feature-discovery labels on
// its Node.
package gpu

import (
	"sort"
	"strconv"
	"strings"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
)

// LabelPrefix is the prefix of every label the labeller sets (GPU feature
// discovery's names, so existing node selectors keep working).
const LabelPrefix = "nvidia.com/"

// Label keys, as GPU feature discovery names them.
const (
	LabelPresent      = "nvidia.com/gpu.present"
	LabelCount        = "nvidia.com/gpu.count"
	LabelProduct      = "nvidia.com/gpu.product"
	LabelMemory       = "nvidia.com/gpu.memory"
	LabelFamily       = "nvidia.com/gpu.family"
	LabelComputeMajor = "nvidia.com/gpu.compute.major"
	LabelComputeMinor = "nvidia.com/gpu.compute.minor"
	LabelReplicas     = "nvidia.com/gpu.replicas"
	LabelMIGCapable   = "nvidia.com/mig.capable"
	LabelMIGStrategy  = "nvidia.com/mig.strategy"
	// LabelMIGConfig names the MIG layout the MIG manager applies to a node
	// (set by people or tools); the manager reports its progress in
	// LabelMIGConfigState (pending, success, failed).
	LabelMIGConfig      = "nvidia.com/mig.config"
	LabelMIGConfigState = "nvidia.com/mig.config.state"
	LabelDriverMajor    = "nvidia.com/cuda.driver-version.major"
	LabelDriverMinor    = "nvidia.com/cuda.driver-version.minor"
	LabelDriverRevision = "nvidia.com/cuda.driver-version.revision"
	LabelDriverFull     = "nvidia.com/cuda.driver-version.full"
	LabelRuntimeMajor   = "nvidia.com/cuda.runtime-version.major"
	LabelRuntimeMinor   = "nvidia.com/cuda.runtime-version.minor"
	LabelRuntimeFull    = "nvidia.com/cuda.runtime-version.full"
)

// MIG strategies.
const (
	MIGStrategyNone   = "none"
	MIGStrategySingle = "single"
	MIGStrategyMixed  = "mixed"
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
	first := st.GPUs[0]
	l := map[string]string{
		LabelPresent:  "true",
		LabelCount:    strconv.Itoa(len(st.GPUs)),
		LabelProduct:  LabelValue(first.Product),
		LabelReplicas: "1",
	}
	if first.MemoryMiB > 0 {
		l[LabelMemory] = strconv.FormatInt(first.MemoryMiB, 10)
	}
	if st.Product == "mixed" {
		l[LabelProduct] = "mixed"
	}
	if first.Architecture != "" {
		l[LabelFamily] = LabelValue(strings.ToLower(first.Architecture))
	}
	if major, minor, ok := strings.Cut(first.ComputeCapability, "."); ok {
		l[LabelComputeMajor], l[LabelComputeMinor] = LabelValue(major), LabelValue(minor)
	}
	capable, mig := false, map[string][2]int64{} // profile -> count, memory
	for _, g := range st.GPUs {
		if g.MIG == nil {
			continue
		}
		capable = capable || g.MIG.Capable
		if g.MIG.CurrentMode != gpuv1alpha1.MIGEnabled {
			continue
		}
		for _, d := range g.MIG.Devices {
			v := mig[d.Profile]
			mig[d.Profile] = [2]int64{v[0] + 1, d.MemoryMiB}
		}
	}
	l[LabelMIGCapable] = strconv.FormatBool(capable)
	if strategy == "" {
		strategy = MIGStrategyNone
		if len(mig) > 0 {
			strategy = MIGStrategyMixed
		}
	}
	l[LabelMIGStrategy] = strategy
	switch {
	case len(mig) == 0 || strategy == MIGStrategyNone:
	case strategy == MIGStrategySingle:
		if len(mig) != 1 {
			l[LabelProduct] = LabelValue(l[LabelProduct] + "-MIG-INVALID")
			l[LabelCount] = "0"
			break
		}
		for profile, v := range mig {
			l[LabelProduct] = LabelValue(l[LabelProduct] + "-MIG-" + profile)
			l[LabelCount] = strconv.FormatInt(v[0], 10)
			if v[1] > 0 {
				l[LabelMemory] = strconv.FormatInt(v[1], 10)
			}
		}
	default: // mixed
		for profile, v := range mig {
			// The key's name part (mig-<profile>.memory) must fit 63 characters.
			p := LabelValue(profile)
			if len(p) > 52 {
				p = LabelValue(p[:52])
			}
			if p == "" {
				continue
			}
			l["nvidia.com/mig-"+p+".count"] = strconv.FormatInt(v[0], 10)
			if v[1] > 0 {
				l["nvidia.com/mig-"+p+".memory"] = strconv.FormatInt(v[1], 10)
			}
		}
	}
	if parts := strings.Split(st.DriverVersion, "."); len(parts) >= 2 {
		l[LabelDriverMajor], l[LabelDriverMinor] = LabelValue(parts[0]), LabelValue(parts[1])
		if len(parts) >= 3 {
			l[LabelDriverRevision] = LabelValue(parts[2])
		}
		l[LabelDriverFull] = LabelValue(st.DriverVersion)
	}
	if major, minor, ok := strings.Cut(st.CUDADriverVersion, "."); ok {
		l[LabelRuntimeMajor], l[LabelRuntimeMinor] = LabelValue(major), LabelValue(minor)
		l[LabelRuntimeFull] = LabelValue(st.CUDADriverVersion)
	}
	for k, v := range l {
		if v == "" {
			delete(l, k)
		}
	}
	return l
}

// LabelValue makes s a valid label value the way GFD does for product
// names (spaces become '-').
func LabelValue(s string) string { return inventory.LabelValue(s) }

// sortedKeys returns the keys of m, sorted.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
