package clusterpolicy

import (
	"fmt"
	"reflect"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// nodeInfoChanged passes Node updates that change its OS or kernel, or its
// taints (which keep operands off it).
func nodeInfoChanged() predicate.Funcs {
	info := func(o client.Object) [5]string {
		n, ok := o.(*corev1.Node)
		if !ok {
			return [5]string{}
		}
		var taints strings.Builder
		for i := range n.Spec.Taints {
			taints.WriteString(n.Spec.Taints[i].ToString() + ",")
		}
		ni := n.Status.NodeInfo
		return [5]string{ni.OSImage, ni.KernelVersion, ni.ContainerRuntimeVersion, ni.KubeletVersion, taints.String()}
	}
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool { return info(e.ObjectOld) != info(e.ObjectNew) }}
}

// configMapChanged passes ConfigMaps of Loom's namespace coming, going,
// and changing content.
func configMapChanged(namespace string) predicate.Funcs {
	inNamespace := func(o client.Object) bool { return o.GetNamespace() == namespace }
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return inNamespace(e.Object) },
		DeleteFunc: func(e event.DeleteEvent) bool { return inNamespace(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okOld := e.ObjectOld.(*corev1.ConfigMap)
			n, okNew := e.ObjectNew.(*corev1.ConfigMap)
			return okOld && okNew && inNamespace(n) && (!reflect.DeepEqual(o.Data, n.Data) || !reflect.DeepEqual(o.BinaryData, n.BinaryData))
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// sumDaemonSets is the driver's DaemonSets as one: counts summed, behind
// when any is.
func sumDaemonSets(sets []*appsv1.DaemonSet) *appsv1.DaemonSet {
	out := &appsv1.DaemonSet{}
	for _, ds := range sets {
		s := ds.Status
		out.Status.DesiredNumberScheduled += s.DesiredNumberScheduled
		out.Status.NumberReady += s.NumberReady
		out.Status.UpdatedNumberScheduled += s.UpdatedNumberScheduled
		if s.ObservedGeneration < ds.Generation {
			out.Generation = 1 // out.Status.ObservedGeneration stays 0: behind
		}
	}
	return out
}

// migStates counts the GPU nodes by the MIG manager's
// nvidia.com/mig.config.state.
type migStates struct {
	pending, success, failed int32
	failedNodes              []string
	// firstFailure is why the first failed node (by name) failed.
	firstFailure string
}

func countMIGStates(nodes []metav1.PartialObjectMetadata) migStates {
	var m migStates
	why := map[string]string{}
	for _, n := range nodes {
		switch n.Labels[gpuv1alpha1.LabelMIGConfigState] {
		case gpuv1alpha1.MIGConfigPending, gpuv1alpha1.MIGConfigRebooting:
			m.pending++
		case gpuv1alpha1.MIGConfigSuccess:
			m.success++
		case gpuv1alpha1.MIGConfigFailed:
			m.failed++
			m.failedNodes = append(m.failedNodes, n.Name)
			why[n.Name] = fmt.Sprintf("MIG layout %q failed", n.Labels[gpuv1alpha1.LabelMIGConfig])
			if msg := n.Annotations[gpuv1alpha1.AnnotationMIGConfigFailure]; msg != "" {
				why[n.Name] += ": " + msg
			}
		}
	}
	sort.Strings(m.failedNodes)
	if len(m.failedNodes) > 0 {
		m.firstFailure = m.failedNodes[0] + ": " + why[m.failedNodes[0]]
	}
	return m
}
