package nodelabels

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
)

// nodeNameField indexes the driver pod cache by node.
const nodeNameField = "spec.nodeName"

// driverPodCache is a cache of Loom's driver pods alone (its labels, in
// Loom's namespace), each kept as its name, node, deletion and whether it
// is ready: the manager's pod cache keeps no labels or conditions of
// operand pods, and a GPU node has one driver pod. The manager starts it
// with its own caches, before any controller.
func driverPodCache(ctx context.Context, mgr ctrl.Manager, namespace string) (cache.Cache, error) {
	o := cache.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), ReaderFailOnMissingInformer: true,
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}),
		DefaultTransform:     trimDriverPod}
	if namespace != "" {
		o.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	}
	c, err := cache.New(mgr.GetConfig(), o)
	if err != nil {
		return nil, err
	}
	if err := c.IndexField(ctx, &corev1.Pod{}, nodeNameField, func(o client.Object) []string {
		if n := o.(*corev1.Pod).Spec.NodeName; n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return c, mgr.Add(startedWithCaches{c})
}

// startedWithCaches makes the manager start a cache with its own, before
// any controller, and wait for it to sync.
type startedWithCaches struct{ cache.Cache }

func (c startedWithCaches) GetCache() cache.Cache { return c.Cache }

// trimDriverPod keeps of a driver pod what the labeller reads.
func trimDriverPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{TypeMeta: p.TypeMeta, ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
		ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp}}
	out.Spec.NodeName = p.Spec.NodeName
	if podReady(p) {
		out.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// driverPods is the watch of Loom's driver pods: a pod created, deleted,
// bound, deleting, or becoming ready or unready relabels its node.
func driverPods(c cache.Cache) source.Source {
	toNode := handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, p *corev1.Pod) []reconcile.Request {
		if p.Spec.NodeName == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: p.Spec.NodeName}}}
	})
	changed := predicate.TypedFuncs[*corev1.Pod]{
		UpdateFunc: func(e event.TypedUpdateEvent[*corev1.Pod]) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return podReady(o) != podReady(n) || o.Spec.NodeName != n.Spec.NodeName ||
				(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
		},
	}
	return source.Kind(c, &corev1.Pod{}, toNode, changed)
}

// loomDriverReady reports whether a driver pod of Loom's on the node is
// ready and not being deleted, read from the driver pod cache.
func (r *Reconciler) loomDriverReady(ctx context.Context, node string) (bool, error) {
	pods := &corev1.PodList{}
	if err := r.DriverPods.List(ctx, pods, client.MatchingFields{nodeNameField: node}); err != nil {
		return false, err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && podReady(&p) {
			return true, nil
		}
	}
	return false, nil
}
