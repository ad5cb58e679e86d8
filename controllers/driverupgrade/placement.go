package driverupgrade

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/daemonplace"
	"github.com/loom-dev/loom/internal/driveros"
)

// nodeConditionTaints prefixes the taints the node lifecycle controller
// sets from a node's conditions (not-ready, unreachable, ...): they come
// and go with the node's health, so a node NotReady mid-upgrade has not
// left the driver's placement.
const nodeConditionTaints = "node.kubernetes.io/"

// driverLeft reports whether the node has left the placement of the
// policy's driver DaemonSets (specs, their pod specs): none would place a
// driver pod there, and that is not only for want of its OS's DaemonSet.
// The ClusterPolicy runs one driver DaemonSet per OS, restricted to its
// OS's nodes; a node kept out only by those restrictions, whose OS has a
// driver image, waits for its OS's DaemonSet (being created, recreated, or
// updated for a node whose OS changed) instead of leaving its upgrade. So
// does every node while the policy has no driver DaemonSet at all.
// precompiled says the driver image is built per kernel.
func driverLeft(specs []corev1.PodSpec, n *corev1.Node, precompiled bool) bool {
	if len(specs) == 0 || driverPlaces(specs, n) {
		return false
	}
	if driveros.Of(n, precompiled).Why != "" {
		return true
	}
	anyOS := make([]corev1.PodSpec, len(specs))
	for i := range specs {
		anyOS[i] = withoutOSRestriction(specs[i])
	}
	return !driverPlaces(anyOS, n)
}

// withoutOSRestriction is spec without the terms of its required node
// affinity that restrict a per-OS driver DaemonSet to its OS's nodes: the
// gpu.loom.dev/driver-target label the ClusterPolicy sets on each node (and
// the restrictions of earlier Loom versions: node feature discovery's
// os_release labels, the nodes' hostname labels or names).
func withoutOSRestriction(spec corev1.PodSpec) corev1.PodSpec {
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return spec
	}
	var terms []corev1.NodeSelectorTerm
	for _, t := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		t.MatchExpressions = slices.DeleteFunc(slices.Clone(t.MatchExpressions), func(r corev1.NodeSelectorRequirement) bool {
			return r.Key == gpuv1alpha1.LabelDriverTarget || r.Key == gpuv1alpha1.LabelOSReleaseID || r.Key == gpuv1alpha1.LabelOSReleaseVersionID ||
				r.Key == corev1.LabelHostname
		})
		t.MatchFields = slices.DeleteFunc(slices.Clone(t.MatchFields), func(r corev1.NodeSelectorRequirement) bool { return r.Key == "metadata.name" })
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			terms = nil // the term was the restriction only: every node
			break
		}
		terms = append(terms, t)
	}
	affinity, nodeAffinity := *spec.Affinity, *spec.Affinity.NodeAffinity
	nodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = nil
	if terms != nil {
		nodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: terms}
	}
	affinity.NodeAffinity = &nodeAffinity
	spec.Affinity = &affinity
	return spec
}

// driverPlaces reports whether a DaemonSet of one of the pod specs (the
// policy's driver DaemonSets) would run a pod on the node, by the
// DaemonSet controller's rules: its node selector and required node
// affinity match the node, and every NoSchedule and NoExecute taint of the
// node is tolerated, apart from the node condition taints.
func driverPlaces(specs []corev1.PodSpec, n *corev1.Node) bool {
	for i := range specs {
		if !daemonplace.Matches(&specs[i], n) {
			continue
		}
		if _, untolerated := daemonplace.Untolerated(&specs[i], n, func(t *corev1.Taint) bool { return strings.HasPrefix(t.Key, nodeConditionTaints) }); !untolerated {
			return true
		}
	}
	return false
}
