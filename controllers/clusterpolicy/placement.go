package clusterpolicy

import (
	"fmt"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
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
		if ok, err := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: *spec}).Match(n); err != nil || !ok {
			continue
		}
		tolerations := append(append([]corev1.Toleration(nil), spec.Tolerations...), daemonTolerations...)
		t, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), n.Spec.Taints, tolerations, func(t *corev1.Taint) bool {
			return (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) && !strings.HasPrefix(t.Key, nodeConditionTaints)
		}, true)
		if !untolerated {
			return nil
		}
		blocking = &t
	}
	return blocking
}
