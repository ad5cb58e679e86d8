package inventory

import corev1 "k8s.io/api/core/v1"

// ReadyCondition is the node's Ready condition; nil when the kubelet has
// not posted one (a node just registered).
func ReadyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// NodeReady reports whether the node's Ready condition is True: a node
// without one (the kubelet has not reported yet) is not ready, as a False or
// Unknown one (the node lifecycle controller's, for a kubelet gone silent)
// is not. Every part of Loom that asks whether a node is ready asks this.
func NodeReady(n *corev1.Node) bool {
	c := ReadyCondition(n)
	return c != nil && c.Status == corev1.ConditionTrue
}
