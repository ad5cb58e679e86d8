package nodelabels

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/podset"
)

// isLoomDriver: the pod is one of Loom's driver pods (in Loom's
// namespace, with its labels: the manager's pod cache keeps them, with the
// Ready condition, for every pod of Loom's operand DaemonSets).
func (r *Reconciler) isLoomDriver(o client.Object) bool {
	l := o.GetLabels()
	return o.GetNamespace() == r.Namespace && l[apply.LabelManagedBy] == apply.ManagedBy && l[gpuv1alpha1.LabelComponent] == gpuv1alpha1.OperandDriver
}

// driverPodChanged passes Loom's driver pods created, deleted, bound,
// deleting, or becoming ready or unready.
func (r *Reconciler) driverPodChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return r.isLoomDriver(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return r.isLoomDriver(e.Object) },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*corev1.Pod)
			n, ok2 := e.ObjectNew.(*corev1.Pod)
			return ok1 && ok2 && r.isLoomDriver(n) && (podset.Ready(o) != podset.Ready(n) || o.Spec.NodeName != n.Spec.NodeName ||
				(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil))
		},
	}
}

// podNode is a request for the pod's node, none before it is bound.
func podNode(_ context.Context, o client.Object) []reconcile.Request {
	p, ok := o.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: p.Spec.NodeName}}}
}

// loomDriverReady reports whether a driver pod of Loom's on the node is
// ready and not being deleted, read from the manager's pod cache (Loom's
// namespace holds one driver pod per GPU node).
func (r *Reconciler) loomDriverReady(ctx context.Context, node string) (bool, error) {
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.InNamespace(r.Namespace),
		client.MatchingLabels{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}); err != nil {
		return false, err
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil && podset.Ready(&p) {
			return true, nil
		}
	}
	return false, nil
}
