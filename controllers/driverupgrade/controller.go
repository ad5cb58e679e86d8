// Package driverupgrade rolls a new NVIDIA driver out node by node, as GPU
// Operator's upgrade controller does: cordon, wait for the jobs the policy
// names, evict the GPU pods (eviction API, so disruption budgets hold),
// optionally drain, replace the node's driver pod, wait for it to be ready,
// uncordon. Progress lives in the node label
// nvidia.com/gpu-driver-upgrade-state (GPU Operator's values) and the
// node's annotations, so a manager restart resumes where it stopped.
//
// plan (pure) picks the nodes a pass advances within the policy's budget;
// next (pure) is one node's transition, from its state, driver pod, pods
// and the clock to its next state and the actions that get it there; the
// reconciler observes, calls them and executes the actions.
package driverupgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/manager"
)

// FieldOwner names the driver upgrade's writes (its driver pod deletes).
const FieldOwner = "loom-driver-upgrade"

// requeue is how soon a pass with upgrades in progress runs again.
const requeue = 3 * time.Second

// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;delete
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create

// Reconciler advances the driver upgrades of the GPU nodes.
type Reconciler struct {
	client.Client
	// Reader reads nodes and pods straight from the API server: the
	// manager does not cache every pod for a rare upgrade, and a node's
	// state must be current before it moves on.
	Reader    client.Reader
	Namespace string
	// Now is the clock the waits and timeouts are measured by.
	Now func() time.Time
	w   *apply.Writer
}

// New returns a reconciler of Loom's namespace on the wall clock.
func New(c client.Client, reader client.Reader, namespace string) *Reconciler {
	return &Reconciler{Client: c, Reader: reader, Namespace: namespace, Now: time.Now, w: apply.NewWriter(c, FieldOwner, apply.Options{})}
}

// Setup registers the driver upgrade controller.
func Setup(_ context.Context, mgr ctrl.Manager, opts manager.Options) error {
	r := New(mgr.GetClient(), mgr.GetAPIReader(), opts.Namespace)
	driverKey := types.NamespacedName{Namespace: opts.Namespace, Name: gpuv1alpha1.OperandObjectName(gpuv1alpha1.OperandDriver)}
	isDriver := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == driverKey.Namespace && o.GetName() == driverKey.Name
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("driver-upgrade").
		// Only a new template starts upgrades; while one runs, the
		// reconciler requeues itself. DaemonSet status churn (every pod of a
		// rollout) would otherwise cost a pod list each.
		For(&appsv1.DaemonSet{}, builder.WithPredicates(isDriver, predicate.GenerationChangedPredicate{})).
		WatchesMetadata(&corev1.Node{},
			handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
				return []reconcile.Request{{NamespacedName: driverKey}}
			}),
			builder.WithPredicates(predicate.Funcs{
				UpdateFunc: func(e event.UpdateEvent) bool {
					return e.ObjectOld.GetLabels()[gpuv1alpha1.LabelUpgradeState] != e.ObjectNew.GetLabels()[gpuv1alpha1.LabelUpgradeState]
				},
				CreateFunc: func(event.CreateEvent) bool { return false },
				DeleteFunc: func(event.DeleteEvent) bool { return false },
			})).
		Complete(r)
}

// Reconcile advances every node's upgrade by at most one step and starts
// new ones within the policy's budget.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ds := &appsv1.DaemonSet{}
	if err := r.Get(ctx, req.NamespacedName, ds); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	cp, err := r.owner(ctx, ds)
	if err != nil || cp == nil {
		return ctrl.Result{}, err
	}
	t := target{policy: cp.Spec.Driver.UpgradePolicy, template: ds.Spec.Template.Annotations[gpuv1alpha1.AnnotationTemplateHash], namespace: r.Namespace}
	drivers, err := r.driverPods(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	nodes := &metav1.PartialObjectMetadataList{}
	nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := r.List(ctx, nodes, client.MatchingLabels{gpuv1alpha1.LabelPresent: "true"}); err != nil {
		return ctrl.Result{}, err
	}
	sort.Slice(nodes.Items, func(i, j int) bool { return nodes.Items[i].Name < nodes.Items[j].Name })
	todo, more, err := plan(nodes.Items, drivers, t.policy, t.template)
	if err != nil {
		return ctrl.Result{}, err
	}
	for _, w := range todo {
		t.start = w.start
		if err := r.advance(ctx, w.node, drivers[w.node], t); err != nil {
			return ctrl.Result{}, fmt.Errorf("node %s: %w", w.node, err)
		}
	}
	if more {
		return ctrl.Result{RequeueAfter: requeue}, nil
	}
	return ctrl.Result{}, nil
}

// owner is the ClusterPolicy controlling the driver DaemonSet, or nil.
func (r *Reconciler) owner(ctx context.Context, ds *appsv1.DaemonSet) (*gpuv1alpha1.ClusterPolicy, error) {
	ref := metav1.GetControllerOf(ds)
	if ref == nil || ref.Kind != "ClusterPolicy" {
		return nil, nil
	}
	cp := &gpuv1alpha1.ClusterPolicy{}
	if err := r.Get(ctx, client.ObjectKey{Name: ref.Name}, cp); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return cp, nil
}

// driverPods are the driver pods by node, not being deleted.
func (r *Reconciler) driverPods(ctx context.Context) (map[string]*corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := r.Reader.List(ctx, pods, client.InNamespace(r.Namespace),
		client.MatchingLabels{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}); err != nil {
		return nil, err
	}
	out := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = p
		}
	}
	return out, nil
}

// advance observes one node as the API server has it (and its pods when
// its state reads them), computes its transition and executes it.
func (r *Reconciler) advance(ctx context.Context, name string, driver *corev1.Pod, t target) error {
	node := &corev1.Node{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return client.IgnoreNotFound(err)
	}
	var pods []corev1.Pod
	if needsPods(node.Labels[gpuv1alpha1.LabelUpgradeState]) {
		list := &corev1.PodList{}
		if err := r.Reader.List(ctx, list, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", name)}); err != nil {
			return err
		}
		pods = list.Items
	}
	from := node.Labels[gpuv1alpha1.LabelUpgradeState]
	state, actions := next(node, driver, pods, t, r.Now())
	if err := r.execute(ctx, name, actions); err != nil {
		return err
	}
	if state != from {
		log.FromContext(ctx).Info("driver upgrade", "node", name, "from", from, "to", state)
	}
	return nil
}

// execute carries out next's actions: evictions and the driver pod delete
// in order, then the node's own changes (cordon, state, annotations) in
// one merge patch. spec.unschedulable and the upgrade label are shared with
// people and other tools, so Loom does not take server-side apply
// ownership of them.
func (r *Reconciler) execute(ctx context.Context, node string, actions []action) error {
	spec, meta := map[string]any{}, map[string]any{}
	why := "node state"
	for _, a := range actions {
		switch a.kind {
		case cordon, uncordon:
			spec["unschedulable"] = a.kind == cordon
		case setState:
			why = "to " + a.state
			meta["labels"] = map[string]string{gpuv1alpha1.LabelUpgradeState: a.state}
			meta["annotations"] = a.annotations
		case evict:
			if err := r.evict(ctx, a.pods); err != nil {
				return err
			}
		case deleteDriver:
			for _, p := range a.pods {
				if err := r.w.Delete(ctx, p, "its driver template is outdated"); err != nil {
					return err
				}
			}
		}
	}
	patch := map[string]any{}
	if len(spec) > 0 {
		patch["spec"] = spec
	}
	if len(meta) > 0 {
		patch["metadata"] = meta
	}
	if len(patch) == 0 {
		return nil
	}
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	return r.w.Patch(ctx, n, client.RawPatch(types.MergePatchType, b), "driver upgrade: "+why)
}

// evict evicts pods through the eviction API: a pod already gone, or one a
// disruption budget holds (429), is not an error; the next pass sees it.
func (r *Reconciler) evict(ctx context.Context, pods []*corev1.Pod) error {
	for _, p := range pods {
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
		if err := r.SubResource("eviction").Create(ctx, p, ev); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsTooManyRequests(err) {
			return fmt.Errorf("evicting %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return nil
}
