package driverupgrade

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/loom-dev/loom/internal/daemonplace"
)

// driverPlaces reports whether a DaemonSet of one of the pod specs (the
// policy's driver DaemonSets) would run a pod on the node, by the
// DaemonSet controller's rules: its node selector and required node
// affinity match the node, and every NoSchedule and NoExecute taint of the
// node is tolerated.
func driverPlaces(specs []corev1.PodSpec, n *corev1.Node) bool {
	for i := range specs {
		if daemonplace.Places(&specs[i], n) {
			return true
		}
	}
	return false
}
