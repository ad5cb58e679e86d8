// Package daemonplace answers, by the DaemonSet controller's own rules,
// whether a DaemonSet's pod would run on a node: its template's required
// node affinity matches the node, and every NoSchedule or NoExecute taint
// of the node is tolerated, by the template or by the tolerations the
// DaemonSet controller adds to every daemon pod.
package daemonplace

import (
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// added are the tolerations the DaemonSet controller adds to every daemon
// pod (node.kubernetes.io/not-ready, unreachable, the pressures,
// unschedulable), beyond its template's.
var added = []corev1.Toleration{
	{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
}

// Matches: the template's node selector and required node affinity match
// n.
func Matches(spec *corev1.PodSpec, n *corev1.Node) bool {
	ok, err := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: *spec}).Match(n)
	return err == nil && ok
}

// Untolerated is the first NoSchedule or NoExecute taint of n that the
// daemon pod of spec does not tolerate, leaving out the taints skip names
// (nil: none); ok is false when there is none.
func Untolerated(spec *corev1.PodSpec, n *corev1.Node, skip func(*corev1.Taint) bool) (taint corev1.Taint, ok bool) {
	tolerations := append(append([]corev1.Toleration(nil), spec.Tolerations...), added...)
	if spec.HostNetwork {
		tolerations = append(tolerations, corev1.Toleration{Key: corev1.TaintNodeNetworkUnavailable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	return corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), n.Spec.Taints, tolerations, func(t *corev1.Taint) bool {
		return (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) && (skip == nil || !skip(t))
	}, true)
}

// Places: a DaemonSet of spec runs a pod on n.
func Places(spec *corev1.PodSpec, n *corev1.Node) bool {
	if !Matches(spec, n) {
		return false
	}
	_, untolerated := Untolerated(spec, n, nil)
	return !untolerated
}
