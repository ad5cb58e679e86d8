package driverupgrade

import (
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// daemonTolerations are the tolerations the DaemonSet controller adds to
// every daemon pod (node.kubernetes.io/not-ready, unreachable, the
// pressures, unschedulable), beyond its template's.
var daemonTolerations = []corev1.Toleration{
	{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
}

// driverPlaces reports whether a DaemonSet of one of the pod specs (the
// policy's driver DaemonSets) would run a pod on the node, by the
// DaemonSet controller's rules: its node selector and required node
// affinity match the node, and every NoSchedule and NoExecute taint of the
// node is tolerated.
func driverPlaces(specs []corev1.PodSpec, n *corev1.Node) bool {
	for i := range specs {
		spec := &specs[i]
		if ok, err := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: *spec}).Match(n); err != nil || !ok {
			continue
		}
		tolerations := append(append([]corev1.Toleration(nil), spec.Tolerations...), daemonTolerations...)
		if spec.HostNetwork {
			tolerations = append(tolerations, corev1.Toleration{Key: corev1.TaintNodeNetworkUnavailable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
		}
		_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), n.Spec.Taints, tolerations, func(t *corev1.Taint) bool {
			return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}, true)
		if !untolerated {
			return true
		}
	}
	return false
}
