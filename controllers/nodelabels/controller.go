package nodelabels

import (
	"context"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/manager"
)

// FieldOwner is the labeller's server-side-apply field manager: on Nodes it
// owns exactly the labels it set, so applying a smaller set removes the
// rest of its own and never touches anyone else's.
const FieldOwner = "loom-gpu-labels"

// AnnotationManagedLabels lists the label keys the labeller set on a Node.
// The cache strips managedFields, so this is how a pass tells, from the
// cache alone, whether an apply would change anything.
const AnnotationManagedLabels = "gpu.loom.dev/managed-labels"

// +kubebuilder:rbac:groups=gpu.loom.dev,resources=gpunodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=gpunodes/status,verbs=get
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch

// Reconciler keeps each GPU node's GFD labels in line with its GPUNode, and
// makes each GPUNode owned by its Node (so it is garbage-collected).
type Reconciler struct {
	client.Client
	w *apply.Writer
}

// New returns a labeller writing through c.
func New(c client.Client) *Reconciler {
	return &Reconciler{Client: c, w: apply.NewWriter(c, FieldOwner, apply.Options{})}
}

// Setup registers the labeller. Nodes are watched as metadata only: labels
// and annotations are all it reads, and a Node's status is most of its size.
func Setup(_ context.Context, mgr ctrl.Manager, _ manager.Options) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("gpu-labels").
		For(&gpuv1alpha1.GPUNode{}).
		WatchesMetadata(&corev1.Node{},
			handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
			}),
			builder.WithPredicates(metadataChanged())).
		// The MIG strategy of the policy in force shapes the labels.
		Watches(&gpuv1alpha1.ClusterPolicy{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			list := &gpuv1alpha1.GPUNodeList{}
			if err := mgr.GetClient().List(ctx, list); err != nil {
				return nil
			}
			out := make([]reconcile.Request, 0, len(list.Items))
			for _, gn := range list.Items {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: gn.Name}})
			}
			return out
		}), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(New(mgr.GetClient()))
}

// metadataChanged passes Node creations and label/annotation/UID changes,
// and drops the heartbeat-driven updates that make up most Node events.
func metadataChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o.GetUID() != n.GetUID() ||
				!maps.Equal(o.GetLabels(), n.GetLabels()) || !maps.Equal(o.GetAnnotations(), n.GetAnnotations())
		},
		DeleteFunc: func(event.DeleteEvent) bool { return false },
	}
}

// Reconcile observes the GPUNode and Node in the cache, computes the labels,
// and applies only when something differs.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	if err := r.Get(ctx, req.NamespacedName, node); err != nil {
		// A deleted Node takes its GPUNode with it (owner reference).
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	gn := &gpuv1alpha1.GPUNode{}
	err := r.Get(ctx, req.NamespacedName, gn)
	if apierrors.IsNotFound(err) {
		gn = nil
	} else if err != nil {
		return ctrl.Result{}, err
	}

	if gn != nil && !ownedBy(gn, node) {
		if err := r.applyOwner(ctx, gn, node); err != nil {
			return ctrl.Result{}, err
		}
	}
	desired := map[string]string{}
	if gn != nil {
		strategy, err := r.migStrategy(ctx)
		if err != nil {
			return ctrl.Result{}, err
		}
		desired = LabelsFor(gn.Status, strategy)
	}
	if labelsUpToDate(node, desired) {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, r.applyLabels(ctx, node.Name, desired)
}

// migStrategy is the MIG strategy of the ClusterPolicy in force, "" when
// none is.
func (r *Reconciler) migStrategy(ctx context.Context) (string, error) {
	list := &gpuv1alpha1.ClusterPolicyList{}
	if err := r.List(ctx, list); err != nil {
		return "", err
	}
	cp := gpuv1alpha1.Active(list.Items)
	switch {
	case cp == nil:
		return "", nil
	case cp.Spec.MIG.Strategy == "":
		return string(gpuv1alpha1.MIGStrategySingle), nil // the API's default
	}
	return string(cp.Spec.MIG.Strategy), nil
}

func (r *Reconciler) applyLabels(ctx context.Context, name string, labels map[string]string) error {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("Node")
	u.SetName(name)
	if len(labels) > 0 {
		u.SetLabels(labels)
		u.SetAnnotations(map[string]string{AnnotationManagedLabels: managedKeys(labels)})
	}
	return r.w.ApplyFields(ctx, u, true, "GPU labels changed")
}

func (r *Reconciler) applyOwner(ctx context.Context, gn *gpuv1alpha1.GPUNode, node *metav1.PartialObjectMetadata) error {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(gpuv1alpha1.GroupVersion.String())
	u.SetKind("GPUNode")
	u.SetName(gn.Name)
	u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}})
	return r.w.ApplyFields(ctx, u, true, "the Node owns its GPUNode")
}

func ownedBy(gn *gpuv1alpha1.GPUNode, node *metav1.PartialObjectMetadata) bool {
	for _, o := range gn.OwnerReferences {
		if o.Kind == "Node" && o.APIVersion == "v1" && o.UID == node.UID {
			return true
		}
	}
	return false
}

// labelsUpToDate reports whether applying desired would change nothing: the
// node carries every desired label, and the labeller owns no other.
func labelsUpToDate(node *metav1.PartialObjectMetadata, desired map[string]string) bool {
	for k, v := range desired {
		if cur, ok := node.Labels[k]; !ok || cur != v {
			return false
		}
	}
	managed, annotated := node.Annotations[AnnotationManagedLabels]
	if len(desired) == 0 {
		return !annotated
	}
	return managed == managedKeys(desired)
}

// managedKeys is the AnnotationManagedLabels value for labels: the sorted
// keys, comma-separated.
func managedKeys(labels map[string]string) string {
	return strings.Join(slices.Sorted(maps.Keys(labels)), ",")
}
