package clusterpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// managerPaused are the operands GPU Operator's driver manager stops on
// its node before it unloads the driver, by setting
// nvidia.com/gpu.deploy.<operand> from true to paused-for-driver-upgrade.
// It stops none whose label is missing, so Loom sets those labels to true,
// as GPU Operator labels its GPU nodes.
var managerPaused = []string{gpuv1alpha1.OperandToolkit, gpuv1alpha1.OperandValidator, gpuv1alpha1.OperandDevicePlugin,
	gpuv1alpha1.OperandDCGM, gpuv1alpha1.OperandDCGMExporter, gpuv1alpha1.OperandMIGManager}

// missingDeployLabels are the nvidia.com/gpu.deploy.<operand>=true labels
// the GPU node n lacks (none or an empty value) for the enabled operands
// the driver manager stops, where Loom's driver runs (its driver manager
// with it). A value anyone set (false, paused, true) is theirs and kept.
func missingDeployLabels(cp *gpuv1alpha1.ClusterPolicy, n *corev1.Node) map[string]string {
	if !cp.Spec.OperandEnabled(gpuv1alpha1.OperandDriver) || !meantFor(n, cp, gpuv1alpha1.OperandDriver) {
		return nil
	}
	out := map[string]string{}
	for _, op := range managerPaused {
		if k := deployLabelPrefix + op; cp.Spec.OperandEnabled(op) && n.Labels[k] == "" {
			out[k] = "true"
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// labelDeploy sets each GPU node's missing deploy labels, one merge patch
// per node conditional on the resourceVersion read (a label set meanwhile,
// by a person or the driver manager, is not overwritten: the patch fails
// and the next pass reads it), returning what failed. A node that has them
// all is not written.
func (r *Reconciler) labelDeploy(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, nodes []corev1.Node) []string {
	var errs []string
	for i := range nodes {
		n := &nodes[i]
		l := missingDeployLabels(cp, n)
		if l == nil {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": n.ResourceVersion, "labels": l}}) // plain data
		target := &corev1.Node{}
		target.Name = n.Name
		if err := r.Patch(ctx, target, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldOwner)); err != nil {
			keys := slices.Sorted(maps.Keys(l))
			errs = append(errs, fmt.Sprintf("node %s: labelling %v=true: %v", n.Name, keys, err))
		}
	}
	return errs
}
