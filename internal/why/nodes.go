package why

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	inv "github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/sharing"
)

// finding is one thing wrong (or not) with a node.
type finding struct {
	state, reason, message, advice string
}

// Node answers why a node's GPUs are not taking work: NotReady, its driver
// upgrade, a cordon, the unhealthy taint, NVML, the MIG layout, GPU labels
// and what the device plugin advertises. gn is the node's GPUNode, nil when
// there is none; names are the GPU resources of the cluster's sharing
// configs.
func Node(node *corev1.Node, gn *gpuv1alpha1.GPUNode, names sharing.Names) Answer {
	a := Answer{Object: "node/" + node.Name}
	fs := nodeFindings(node, gn, names)
	if gn != nil {
		g := GPUNode(gn)
		if g.State != "Ready" {
			fs = append(fs, finding{state: g.State, reason: g.Reason, message: "GPUNode: " + g.Message, advice: g.Advice})
		}
	}
	if len(fs) == 0 {
		a.State, a.Message = "Ready", gpuSummary(node, gn, names)
		return a
	}
	a.State, a.Reason, a.Message, a.Advice = fs[0].state, fs[0].reason, fs[0].message, fs[0].advice
	for _, f := range fs[1:] {
		a.Also = append(a.Also, fmt.Sprintf("%s (%s): %s", f.state, f.reason, OneLine(f.message)))
	}
	return a
}

// nodeFindings are the node's own problems, the most blocking first.
func nodeFindings(node *corev1.Node, gn *gpuv1alpha1.GPUNode, names sharing.Names) []finding {
	var fs []finding
	if !inv.NodeReady(node) {
		reason, msg := "NoReadyCondition", "the kubelet has not reported the node's Ready condition yet"
		if c := inv.ReadyCondition(node); c != nil {
			reason, msg = c.Reason, c.Message
		}
		fs = append(fs, finding{"NotReady", reason, msg, "the kubelet is not reporting: kubectl describe node " + node.Name})
	}
	fs = append(fs, upgradeFindings(node)...)
	if node.Spec.Unschedulable && node.Annotations[gpuv1alpha1.AnnotationClaim] == "" {
		fs = append(fs, finding{"Cordoned", "Unschedulable", "the node is cordoned (not by a Loom driver upgrade)", "kubectl uncordon " + node.Name + " once it may take pods again"})
	}
	for _, t := range node.Spec.Taints {
		if t.Key == gpuv1alpha1.TaintUnhealthy {
			fs = append(fs, finding{"Tainted", "UnhealthyGPUs", fmt.Sprintf("tainted %s=%s:%s: a GPU of the node is unhealthy", t.Key, t.Value, t.Effect),
				fmt.Sprintf("kubectl loom why gpunode/%s names the GPU; after repairing it, kubectl annotate gpunode %s %s=all", node.Name, node.Name, gpuv1alpha1.AnnotationResetGPUHealth)})
		}
	}
	if node.Labels[gpuv1alpha1.LabelMIGConfigState] == gpuv1alpha1.MIGConfigFailed {
		msg := fmt.Sprintf("the MIG manager failed to apply layout %q", node.Labels[gpuv1alpha1.LabelMIGConfig])
		if f := node.Annotations[gpuv1alpha1.AnnotationMIGConfigFailure]; f != "" {
			msg += ": " + f
		}
		fs = append(fs, finding{"MIGFailed", "MIGConfigFailed", msg,
			"check the MIG manager pod on the node: " + podsOn(gpuv1alpha1.OperandMIGManager, node.Name)})
	}
	if !IsGPUNode(node, gn != nil, names) {
		fs = append(fs, finding{"NoGPUs", "NotAGPUNode", "the node is not labelled " + gpuv1alpha1.LabelPresent + "=true, has no GPUNode and advertises no GPU resource",
			"if it has GPUs: check that node feature discovery or the Loom node agent runs on it"})
	} else if len(gpuResources(node.Status.Allocatable, names)) == 0 {
		fs = append(fs, finding{"NoGPUResources", "DevicePluginNotReady", "the node advertises no GPU resource: the device plugin has not registered its GPUs",
			"check the device plugin pod on the node: " + podsOn(gpuv1alpha1.OperandDevicePlugin, node.Name)})
	}
	return fs
}

// upgradeFindings are the node's driver upgrade state, when it has one.
func upgradeFindings(node *corev1.Node) []finding {
	state := node.Labels[gpuv1alpha1.LabelUpgradeState]
	claim := node.Annotations[gpuv1alpha1.AnnotationClaim]
	switch {
	case state == "":
		return nil
	case claim == "":
		return []finding{{"UpgradeIgnored", "NotClaimed", fmt.Sprintf("%s=%s was not set by Loom (no %s annotation): Loom leaves the node alone",
			gpuv1alpha1.LabelUpgradeState, state, gpuv1alpha1.AnnotationClaim),
			fmt.Sprintf("remove the label if nothing else upgrades this node: kubectl label node %s %s-", node.Name, gpuv1alpha1.LabelUpgradeState)}}
	case state == gpuv1alpha1.UpgradeFailed:
		msg := "driver upgrade failed"
		if f := node.Annotations[gpuv1alpha1.AnnotationFailure]; f != "" {
			msg += ": " + f
		}
		return []finding{{"UpgradeFailed", "UpgradeFailed", msg,
			fmt.Sprintf("fix the cause on the node; a new driver version retries it, or kubectl annotate clusterpolicy %s %s=true lets the rollout go past it (the node stays cordoned)",
				claim, gpuv1alpha1.AnnotationResume)}}
	case state == gpuv1alpha1.UpgradeDone:
		return nil
	}
	msg := fmt.Sprintf("driver upgrade in progress for ClusterPolicy %s: %s", claim, state)
	if b := node.Annotations[gpuv1alpha1.AnnotationBlocked]; b != "" {
		msg += "; blocked: " + b
	}
	return []finding{{"Upgrading", "UpgradeInProgress", msg, "kubectl loom upgrades shows the rollout; the node is uncordoned when it is done"}}
}

// gpuSummary describes a healthy GPU node in a few words.
func gpuSummary(node *corev1.Node, gn *gpuv1alpha1.GPUNode, names sharing.Names) string {
	var parts []string
	product := node.Labels[gpuv1alpha1.LabelProduct]
	if product == "" && gn != nil {
		product = gn.Status.Product
	}
	for _, r := range gpuResources(node.Status.Allocatable, names) {
		q := node.Status.Allocatable[r]
		parts = append(parts, fmt.Sprintf("%d %s", q.Value(), r))
	}
	s := strings.Join(parts, ", ") + " allocatable"
	if product != "" {
		s = product + ": " + s
	}
	return s + "; schedulable, no GPU problem known"
}

// GPUNode answers from the node agent's conditions and its GPUs' health.
func GPUNode(gn *gpuv1alpha1.GPUNode) Answer {
	a := Answer{Object: "gpunode/" + gn.Name}
	cs := gn.Status.Conditions
	if len(cs) == 0 {
		a.State, a.Reason = "Unknown", "NoStatus"
		a.Message = "the node agent has not reported yet"
		a.Advice = "check the node agent pod on the node: " + podsOn("node-agent", gn.Name)
		return a
	}
	unhealthy := UnhealthyGPUs(gn)
	switch c := cond(cs, gpuv1alpha1.ConditionNVMLUnavailable); {
	case c != nil && c.Status == "True" && c.Reason == gpuv1alpha1.ReasonUnprivileged:
		a.State, a.Reason, a.Message = "NVMLUnavailable", c.Reason, "the node agent runs unprivileged: NVML: "+c.Message
		a.Advice = "nodeAgent.privileged=true (the chart) lets the agent read the GPUs, or make NVIDIA's container runtime the node's default"
	case c != nil && c.Status == "True":
		a.State, a.Reason, a.Message = "NVMLUnavailable", c.Reason, c.Message
		a.Advice = "check the driver pod on the node: " + podsOn(gpuv1alpha1.OperandDriver, gn.Name)
	case len(unhealthy) > 0:
		a.State, a.Reason = "Unhealthy", gpuv1alpha1.ReasonUnhealthyGPUs
		a.Message = strings.Join(unhealthy, "; ")
		a.Advice = healthAdvice(gn)
	case isFalse(cs, gpuv1alpha1.ConditionReady):
		r := cond(cs, gpuv1alpha1.ConditionReady)
		a.State, a.Reason, a.Message = "NotReady", r.Reason, r.Message
		a.Advice = "read the node agent's log: " + podsOn("node-agent", gn.Name) + ", then kubectl logs"
	default:
		a.State = "Ready"
		a.Message = fmt.Sprintf("%d × %s, driver %s, all healthy", gn.Status.GPUCount, gn.Status.Product, gn.Status.DriverVersion)
	}
	if c := cond(cs, gpuv1alpha1.ConditionTruncated); c != nil && c.Status == "True" {
		// The status holds only what fits: a GPU or MIG device left out
		// is neither counted nor watched for health here.
		a.Message += "; the status is cut (" + c.Reason + "): " + c.Message
		if a.Advice == "" {
			a.Advice = "the GPUNode lists only what fits its status; nvidia-smi on the node shows the rest"
		}
	}
	return a
}

// UnhealthyGPUs describes each unhealthy GPU of the node.
func UnhealthyGPUs(gn *gpuv1alpha1.GPUNode) []string {
	var out []string
	for _, g := range gn.Status.GPUs {
		if g.Health.State != gpuv1alpha1.GPUUnhealthy {
			continue
		}
		s := fmt.Sprintf("GPU %d (%s) %s", g.Index, g.UUID, g.Health.Reason)
		if g.Health.Message != "" {
			s += ": " + g.Health.Message
		}
		out = append(out, s)
	}
	return out
}

// healthAdvice is what to do about the first unhealthy GPU.
func healthAdvice(gn *gpuv1alpha1.GPUNode) string {
	reset := fmt.Sprintf("kubectl annotate gpunode %s %s=all", gn.Name, gpuv1alpha1.AnnotationResetGPUHealth)
	for _, g := range gn.Status.GPUs {
		if g.Health.State != gpuv1alpha1.GPUUnhealthy {
			continue
		}
		switch g.Health.Reason {
		case gpuv1alpha1.HealthRowRemapFailure:
			return "the GPU has no spare memory rows left: it needs replacing"
		case gpuv1alpha1.HealthRowRemapPending:
			return "drain the node and reset the GPU (nvidia-smi -r) to apply the row remap; it clears on its own afterwards"
		case gpuv1alpha1.HealthXidCriticalError, gpuv1alpha1.HealthDoubleBitECC:
			return "drain the node, reset the GPU (nvidia-smi -r) or reboot the node, then " + reset + "; replace the GPU if it recurs"
		}
		break
	}
	return "repair the GPU, then " + reset
}

// podsOn is the kubectl command that lists a component's pods on a node.
func podsOn(component, node string) string {
	return fmt.Sprintf("kubectl get pods -A -l %s=%s --field-selector spec.nodeName=%s", gpuv1alpha1.LabelComponent, component, node)
}
