package clusterpolicy

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/daemonplace"
)

// nodeConditionTaints prefixes the taints the node lifecycle controller
// sets from a node's conditions (not-ready, unreachable, ...): they come
// and go with the node, and are no one's to tolerate.
const nodeConditionTaints = "node.kubernetes.io/"

// untoleratedTaints names, per operand, the GPU nodes meant for it
// (meantFor) that its DaemonSets match by node affinity but place no pod
// on for a taint none of them tolerates, by the DaemonSet controller's
// rules, with the taint: "gpu-c (dedicated=ml:NoSchedule)". The node
// lifecycle controller's taints are left out (a NotReady node is the
// node's trouble, not the policy's).
func untoleratedTaints(cp *gpuv1alpha1.ClusterPolicy, objects []client.Object, nodes []corev1.Node) map[string][]string {
	specs := map[string][]*corev1.PodSpec{}
	for _, o := range objects {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			op := ds.Labels[gpuv1alpha1.LabelComponent]
			specs[op] = append(specs[op], &ds.Spec.Template.Spec)
		}
	}
	out := map[string][]string{}
	for op, ss := range specs {
		for i := range nodes {
			n := &nodes[i]
			if !meantFor(n, cp, op) {
				continue
			}
			if t := blockingTaint(ss, n); t != nil {
				out[op] = append(out[op], fmt.Sprintf("%s (%s)", n.Name, t.ToString()))
			}
		}
		sort.Strings(out[op])
	}
	return out
}

// blockingTaint is the taint that keeps every one of specs whose node
// affinity matches n off n (nil: one places a pod there, or none matches).
func blockingTaint(specs []*corev1.PodSpec, n *corev1.Node) *corev1.Taint {
	var blocking *corev1.Taint
	for _, spec := range specs {
		if !daemonplace.Matches(spec, n) {
			continue
		}
		t, untolerated := daemonplace.Untolerated(spec, n, func(t *corev1.Taint) bool { return strings.HasPrefix(t.Key, nodeConditionTaints) })
		if !untolerated {
			return nil
		}
		blocking = &t
	}
	return blocking
}

// deployLabelPrefix starts GPU Operator's per-node opt-out labels:
// nvidia.com/gpu.deploy.<operand>=false, nvidia.com/gpu.deploy.operands=false.
const deployLabelPrefix = gpuv1alpha1.DeployLabelPrefix

// preInstalled is GPU Operator's nvidia.com/gpu.deploy.driver value for a
// node whose host has a driver of its own: a driver container there would
// fight it for the kernel modules.
const preInstalled = gpuv1alpha1.DeployDriverPreInstalled

// Paused values are what GPU Operator's driver manager (the driver pod's
// init container) and MIG manager set nvidia.com/gpu.deploy.<operand> to
// while they unload the driver or change a GPU's MIG mode: the operands on
// the node, whose open device files would hold the driver or the GPU, must
// stop until they set it back to true.
const (
	pausedForDriverUpgrade = "paused-for-driver-upgrade"
	pausedForMIGChange     = "paused-for-mig-change"
)

// optedOut are the values of nvidia.com/gpu.deploy.<operand> that keep the
// operand off a node: false, for the driver pre-installed, for the others
// the paused values (no manager pauses the driver).
func optedOut(op string) []string {
	if op == gpuv1alpha1.OperandDriver {
		return []string{"false", preInstalled}
	}
	return []string{"false", pausedForDriverUpgrade, pausedForMIGChange}
}

// gpuOperatorApps are GPU Operator's app labels of the operands its driver
// manager and MIG manager stop: they wait for the pods of these labels on
// their node to be gone before they touch the driver or the GPUs.
var gpuOperatorApps = map[string]string{
	gpuv1alpha1.OperandToolkit:            "nvidia-container-toolkit-daemonset",
	gpuv1alpha1.OperandValidator:          "nvidia-operator-validator",
	gpuv1alpha1.OperandDevicePlugin:       "nvidia-device-plugin-daemonset",
	gpuv1alpha1.OperandDCGM:               "nvidia-dcgm",
	gpuv1alpha1.OperandDCGMExporter:       "nvidia-dcgm-exporter",
	gpuv1alpha1.OperandMIGManager:         "nvidia-mig-manager",
	gpuv1alpha1.OperandNodeStatusExporter: "nvidia-node-status-exporter",
}

// optedOutLabels names the labels that keep the operand off a node, e.g.
// nvidia.com/gpu.deploy.driver=false or =pre-installed.
func optedOutLabels(op string) string {
	return deployLabelPrefix + op + "=" + strings.Join(optedOut(op), " or =")
}

// optOut makes the pod's opt-out requirement on nvidia.com/gpu.deploy.<op>
// name every value of optedOut.
func optOut(pod *corev1.PodSpec, op string) {
	exprs := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions
	for i := range exprs {
		if exprs[i].Key == deployLabelPrefix+op {
			exprs[i].Values = optedOut(op)
		}
	}
}

// meantFor reports whether the operand is meant to run on the GPU node n:
// n has not opted out of it (nvidia.com/gpu.deploy.<operand>=false, for the
// driver also =pre-installed, or nvidia.com/gpu.deploy.operands=false) and
// matches its node selector.
func meantFor(n *corev1.Node, cp *gpuv1alpha1.ClusterPolicy, op string) bool {
	l := n.Labels
	if l[deployLabelPrefix+"operands"] == "false" || slices.Contains(optedOut(op), l[deployLabelPrefix+op]) {
		return false
	}
	for k, v := range cp.Spec.Operand(op).NodeSelector {
		if cur, ok := l[k]; !ok || cur != v {
			return false
		}
	}
	return true
}
