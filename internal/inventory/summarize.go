// Package inventory is Loom's view of every node's GPUs: the manager's side
// (Index) answers "how many GPUs of which product exist, are free, and does
// this gang fit" from GPUNode objects and pod requests. The node agent's
// side, which reads a node's GPUs through NVML, is package collect.
package inventory

import gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"

// Summarize fills the summary fields (count, product, MIG) from the GPUs.
func Summarize(st *gpuv1alpha1.GPUNodeStatus) {
	st.GPUCount = int32(len(st.GPUs))
	st.Product, st.MIG = "", ""
	for i, g := range st.GPUs {
		mode := string(gpuv1alpha1.MIGDisabled)
		if g.MIG != nil && g.MIG.CurrentMode == gpuv1alpha1.MIGEnabled {
			mode = string(gpuv1alpha1.MIGEnabled)
		}
		if i == 0 {
			st.Product, st.MIG = g.Product, mode
			continue
		}
		if st.Product != g.Product {
			st.Product = "mixed"
		}
		if st.MIG != mode {
			st.MIG = "Mixed"
		}
	}
}
