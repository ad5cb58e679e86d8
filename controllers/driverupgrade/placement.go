package driverupgrade

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/loom-dev/loom/internal/daemonplace"
)

// nodeConditionTaints prefixes the taints the node lifecycle controller
// sets from a node's conditions (not-ready, unreachable, ...): they come
// and go with the node's health, so a node NotReady mid-upgrade has not
// left the driver's placement.
const nodeConditionTaints = "node.kubernetes.io/"

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
