package clusterpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// nodeLabels is the label patch of the GPU node n (nil: none): its
// missing deploy labels, and its gpu.loom.dev/driver-target set to target
// (removed where target is "").
func nodeLabels(cp *gpuv1alpha1.ClusterPolicy, n *corev1.Node, target string) map[string]*string {
	out := map[string]*string{}
	for k, v := range missingDeployLabels(cp, n) {
		out[k] = &v
	}
	if cur, ok := n.Labels[gpuv1alpha1.LabelDriverTarget]; cur != target || (ok && target == "") {
		out[gpuv1alpha1.LabelDriverTarget] = nil
		if target != "" {
			out[gpuv1alpha1.LabelDriverTarget] = &target
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// labelNodes writes each GPU node's labels (nodeLabels), one merge patch
// per node conditional on the resourceVersion read (a label set
// meanwhile, by a person or the driver manager, is not overwritten: the
// patch fails and the next pass reads it), returning what failed. A node
// whose labels are right is not written. A node changed since it was read
// is no failure: retry says to read it again soon (a status-only change,
// which the watch passes over, may be why). relabelled says a node's
// driver-target label was to be set, changed or removed.
func (r *Reconciler) labelNodes(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, nodes []corev1.Node,
	targets map[string]string) (errs []string, retry, relabelled bool) {
	for i := range nodes {
		n := &nodes[i]
		l := nodeLabels(cp, n, targets[n.Name])
		if l == nil {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": n.ResourceVersion, "labels": l}}) // plain data
		obj := &corev1.Node{}
		obj.Name = n.Name
		err := r.w.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch), "GPU node labels for the driver and its manager")
		switch {
		case apierrors.IsConflict(err), apierrors.IsNotFound(err):
			retry = true
		case err != nil:
			errs = append(errs, fmt.Sprintf("node %s: labelling %v: %v", n.Name, slices.Sorted(maps.Keys(l)), err))
		}
		if _, target := l[gpuv1alpha1.LabelDriverTarget]; target {
			relabelled = true
		}
	}
	return errs, retry, relabelled
}

// labelled is nodes as they are once labelled with their driver targets
// (copies): the driver DaemonSets' placement is judged on these, a node
// not yet labelled being as good as placed.
func labelled(nodes []corev1.Node, targets map[string]string) []corev1.Node {
	out := make([]corev1.Node, len(nodes))
	for i := range nodes {
		out[i] = nodes[i]
		out[i].Labels = maps.Clone(nodes[i].Labels)
		if out[i].Labels == nil {
			out[i].Labels = map[string]string{}
		}
		delete(out[i].Labels, gpuv1alpha1.LabelDriverTarget)
		if t := targets[nodes[i].Name]; t != "" {
			out[i].Labels[gpuv1alpha1.LabelDriverTarget] = t
		}
	}
	return out
}

// writeAll labels the GPU nodes, then writes the policy's children
// (write). A driver DaemonSet places the nodes of its target label: one
// written before the DaemonSet controller has seen a node's label would
// have it delete that node's driver pod (a Loom upgrade turning node lists
// into the label, a node's OS changing). So a pass that sets or changes a
// node's target label, or fails to, writes and removes no driver
// DaemonSet; the next, reading the nodes labelled, does (retry asks for
// it).
func (r *Reconciler) writeAll(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, p plan, nodes []corev1.Node, driverSets []string) (errs []string, retry bool) {
	errs, retry, relabelled := r.labelNodes(ctx, cp, nodes, p.targets)
	if relabelled {
		held := maps.Clone(p.held)
		held[gpuv1alpha1.OperandDriver] = "its nodes' target labels first"
		p.held, driverSets = held, nil
		p.objects = slices.DeleteFunc(slices.Clone(p.objects), func(o client.Object) bool {
			_, ds := o.(*appsv1.DaemonSet)
			return ds && o.GetLabels()[gpuv1alpha1.LabelComponent] == gpuv1alpha1.OperandDriver
		})
	}
	return append(errs, r.write(ctx, cp, p, driverSets)...), retry || relabelled
}
