package clusterpolicy

import (
	"fmt"
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
