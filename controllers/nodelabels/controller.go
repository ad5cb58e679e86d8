package nodelabels

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

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
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/sharing"
)

// The labeller's field manager and Node annotations (see gpuv1alpha1).
const (
	FieldOwner              = gpuv1alpha1.FieldOwnerGPULabels
	AnnotationManagedLabels = gpuv1alpha1.AnnotationManagedLabels
	AnnotationTaint         = gpuv1alpha1.AnnotationUnhealthyTaint
)

// ReasonInvalidConfig is the reason of the Warning event on the
// ClusterPolicy when a node's device plugin config cannot be used.
const ReasonInvalidConfig = "InvalidDevicePluginConfig"

// +kubebuilder:rbac:groups=gpu.loom.dev,resources=gpunodes,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=gpunodes/status,verbs=get
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch

// Reconciler keeps each GPU node's GFD labels in line with its GPUNode, its
// NFD labels and its device plugin config, taints nodes with unhealthy GPUs
// when the policy asks, and makes each GPUNode owned by its Node (so it is
// garbage-collected), deleting one whose Node is gone itself.
type Reconciler struct {
	client.Client
	// Live reads around the cache: whether a GPUNode's Node is gone
	// before the GPUNode is deleted.
	Live client.Reader
	// Recorder records config errors on the ClusterPolicy.
	Recorder recorder.EventRecorder
	// Namespace is Loom's: the device plugin's ConfigMap and the driver
	// pods live there.
	Namespace string
	w         *apply.Writer
	orphans   orphans
}

// New returns a labeller writing through c.
func New(c client.Client, live client.Reader, rec recorder.EventRecorder, namespace string) *Reconciler {
	return &Reconciler{Client: c, Live: live, Recorder: rec, Namespace: namespace, w: apply.NewWriter(c, FieldOwner, apply.Options{})}
}

// Setup registers the labeller. Nodes are watched as metadata (labels and
// annotations, NFD's PCI labels included) and as the trimmed typed Nodes
// the inventory caches, for their taints: a Node's status is most of its
// size, and neither cache holds it.
func Setup(ctx context.Context, mgr ctrl.Manager, opts manager.Options) error {
	r := New(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder(FieldOwner), opts.Namespace)
	return ctrl.NewControllerManagedBy(mgr).
		Named("gpu-labels").
		For(&gpuv1alpha1.GPUNode{}).
		WatchesMetadata(&corev1.Node{},
			handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
			}),
			builder.WithPredicates(metadataChanged())).
		// Typed Nodes (trimmed, cached for the inventory) for their
		// taints: Loom's taint removed by hand.
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
		}), builder.WithPredicates(taintChanged())).
		// The policy in force shapes the labels (MIG strategy, sharing)
		// and the taint.
		Watches(&gpuv1alpha1.ClusterPolicy{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return r.gpuNodes(ctx)
		}), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// So does the content of the device plugin's ConfigMap.
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.configMapNodes)).
		// A driver pod of Loom's ready or not decides a host driver's
		// pre-installed label.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podNode), builder.WithPredicates(r.driverPodChanged())).
		Complete(r)
}

// gpuNodes are requests for every GPUNode's node.
func (r *Reconciler) gpuNodes(ctx context.Context) []reconcile.Request {
	list := &gpuv1alpha1.GPUNodeList{}
	if err := r.List(ctx, list); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, gn := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: gn.Name}})
	}
	return out
}

// configMapNodes are the GPU nodes to relabel when o, a ConfigMap, is the
// device plugin config of the policy in force.
func (r *Reconciler) configMapNodes(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetNamespace() != r.Namespace {
		return nil
	}
	cp, err := r.activePolicy(ctx)
	if err != nil || cp == nil || cp.Spec.DevicePlugin.Config == nil || cp.Spec.DevicePlugin.Config.ConfigMapName != o.GetName() {
		return nil
	}
	return r.gpuNodes(ctx)
}

// metadataChanged passes Node creations, deletions and label/annotation/UID
// changes, and drops the heartbeat-driven updates that make up most Node
// events.
func metadataChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o.GetUID() != n.GetUID() ||
				!maps.Equal(o.GetLabels(), n.GetLabels()) || !maps.Equal(o.GetAnnotations(), n.GetAnnotations())
		},
	}
}

// taintChanged passes Node creations and the updates that change the
// nvidia.com/gpu.unhealthy:NoSchedule taint.
func taintChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok := e.ObjectOld.(*corev1.Node)
			n, ok2 := e.ObjectNew.(*corev1.Node)
			if !ok || !ok2 {
				return false
			}
			a, b := loomTaint(o.Spec.Taints), loomTaint(n.Spec.Taints)
			return (a == nil) != (b == nil) || (a != nil && a.Value != b.Value)
		},
		DeleteFunc: func(event.DeleteEvent) bool { return false },
	}
}

// Reconcile observes the Node, its GPUNode, the policy in force and its
// device plugin config in the cache, computes the labels and the taint,
// and writes only what differs.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	nodeErr := r.Get(ctx, req.NamespacedName, node)
	if nodeErr != nil && !apierrors.IsNotFound(nodeErr) {
		return ctrl.Result{}, nodeErr
	}
	gn := &gpuv1alpha1.GPUNode{}
	err := r.Get(ctx, req.NamespacedName, gn)
	if apierrors.IsNotFound(err) {
		gn = nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	if nodeErr != nil {
		wait, err := r.deleteOrphan(ctx, gn)
		return ctrl.Result{RequeueAfter: wait}, err
	}
	if gn != nil && !ownedBy(gn, node) {
		if err := r.applyOwner(ctx, gn, node); err != nil {
			return ctrl.Result{}, err
		}
	}
	cp, err := r.activePolicy(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	in := Input{NodeLabels: node.Labels, Managed: managedList(node), MIGStrategy: migStrategy(cp)}
	var st *gpuv1alpha1.GPUNodeStatus
	if gn != nil {
		st = &gn.Status
		in.GPUNode = st
		if len(st.GPUs) > 0 {
			if in.Sharing, err = r.sharingFor(ctx, cp, node); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	if HostDriver(in) {
		if in.LoomDriverReady, err = r.loomDriverReady(ctx, node.Name); err != nil {
			return ctrl.Result{}, err
		}
	}
	// The taint first: its patch holds the cached resourceVersion, which a
	// label write would make stale. A conflict (the cache behind the
	// Node) is no failure: the pass runs again.
	err = r.syncTaint(ctx, node, UnhealthyTaint(st, cp != nil && cp.Spec.Health.TaintUnhealthyNodes))
	if apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	if desired := Desired(in); !labelsUpToDate(node, desired) {
		return ctrl.Result{}, r.applyLabels(ctx, node.Name, desired)
	}
	return ctrl.Result{}, nil
}

// conflictRetry is how soon a pass whose taint patch met a newer Node
// runs again: its cache is about to catch up.
const conflictRetry = 250 * time.Millisecond

// deleteOrphan deletes gn (nil: nothing to do), whose Node the cache does
// not have, once the API server confirms the Node is gone: the garbage
// collector deletes a GPUNode owned by a deleted Node, but not one that
// never had its owner reference (its Node deleted while the manager was
// down, or the agent writing after the Node was deleted). The delete is
// for gn's UID only, so a GPUNode made since for a new Node of that name
// stays. A name whose GPUNode it deleted less than orphanRetry ago waits
// out the rest (returned): the agent of a Node deleted while it still runs
// puts its GPUNode back at once, and the two would otherwise delete and
// create it in a loop until the pod goes.
func (r *Reconciler) deleteOrphan(ctx context.Context, gn *gpuv1alpha1.GPUNode) (time.Duration, error) {
	if gn == nil || gn.DeletionTimestamp != nil {
		return 0, nil
	}
	if wait := r.orphans.wait(gn.Name, time.Now()); wait > 0 {
		return wait, nil
	}
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	if err := r.Live.Get(ctx, client.ObjectKey{Name: gn.Name}, node); !apierrors.IsNotFound(err) {
		return 0, err // the Node is there (the cache is behind: its event follows), or the read failed
	}
	log.FromContext(ctx).Info("deleting the GPUNode of a deleted Node", "gpunode", gn.Name, "uid", gn.UID)
	r.orphans.deleted(gn.Name, time.Now())
	return 0, r.w.Delete(ctx, gn, "its Node is gone")
}

// orphanRetry is how long after deleting the GPUNode of a deleted Node the
// labeller leaves one made again under its name.
const orphanRetry = time.Minute

// orphans remembers when the labeller last deleted each name's GPUNode,
// for orphanRetry (in the manager's memory: its own monotonic clock, no
// other's).
type orphans struct {
	mu sync.Mutex
	at map[string]time.Time
}

// wait is how long name's GPUNode is still to be left alone; entries past
// orphanRetry are forgotten on the way.
func (o *orphans) wait(name string, now time.Time) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	for n, at := range o.at {
		if now.Sub(at) >= orphanRetry {
			delete(o.at, n)
		}
	}
	if at, ok := o.at[name]; ok {
		return orphanRetry - now.Sub(at)
	}
	return 0
}

func (o *orphans) deleted(name string, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.at == nil {
		o.at = map[string]time.Time{}
	}
	o.at[name] = now
}

// activePolicy is the ClusterPolicy in force, nil when none is.
func (r *Reconciler) activePolicy(ctx context.Context) (*gpuv1alpha1.ClusterPolicy, error) {
	list := &gpuv1alpha1.ClusterPolicyList{}
	if err := r.List(ctx, list); err != nil {
		return nil, err
	}
	return gpuv1alpha1.Active(list.Items), nil
}

// migStrategy is the MIG strategy of the policy, "" without one.
func migStrategy(cp *gpuv1alpha1.ClusterPolicy) string {
	switch {
	case cp == nil:
		return ""
	case cp.Spec.MIG.Strategy == "":
		return string(gpuv1alpha1.MIGStrategySingle) // the API's default
	}
	return string(cp.Spec.MIG.Strategy)
}

// sharingFor is the node's device plugin config, read from the cache. A
// config that cannot be used gives nil (the node's sharing labels stay as
// they are) and a Warning event on the policy naming the ConfigMap, the key
// and the error.
func (r *Reconciler) sharingFor(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, node *metav1.PartialObjectMetadata) (*sharing.Node, error) {
	src, err := sharing.Read(ctx, r.Client, cp, r.Namespace)
	if err != nil {
		return nil, err
	}
	n, err := sharing.ForNode(src, node.Labels)
	if err != nil {
		log.FromContext(ctx).Info("device plugin config unusable; sharing labels left as they are", "node", node.Name, "error", err.Error())
		r.Recorder.Eventf(cp, nil, corev1.EventTypeWarning, ReasonInvalidConfig, "LabelNodes",
			"%s; the sharing labels (nvidia.com/gpu.replicas, nvidia.com/gpu.sharing-strategy) of the nodes using it are left as they are", err)
		return nil, nil
	}
	return &n, nil
}

// syncTaint puts the node's nvidia.com/gpu.unhealthy:NoSchedule taint in
// line with want (nil: none), as the node lifecycle controller keeps its
// not-ready taint: Loom's taint removed by hand while a GPU is unhealthy
// comes back. The taint is Loom's when the node's annotation records it; a
// taint of the key Loom did not record is someone else's and never
// touched. The taints are read from the cache of typed Nodes and patched
// with the cached resourceVersion as a precondition, so no taint someone
// else adds in between is lost (a stale cache is a conflict, and the pass
// runs again). Node taints are an atomic list: a server-side apply would
// own, and so replace, all of them.
func (r *Reconciler) syncTaint(ctx context.Context, meta *metav1.PartialObjectMetadata, want *corev1.Taint) error {
	recorded, ours := meta.Annotations[AnnotationTaint]
	if !ours && want == nil {
		return nil
	}
	node := &corev1.Node{}
	if err := r.Get(ctx, client.ObjectKey{Name: meta.Name}, node); err != nil {
		return client.IgnoreNotFound(err) // its create event follows
	}
	cur := loomTaint(node.Spec.Taints)
	switch {
	case !ours && cur != nil:
		return nil // someone else's taint holds the node
	case want != nil && cur != nil && cur.Value == want.Value && recorded == want.Value:
		return nil
	}
	base, patched := node.DeepCopy(), node.DeepCopy()
	base.Annotations, patched.Annotations = map[string]string{}, map[string]string{}
	if ours {
		base.Annotations[AnnotationTaint] = recorded
	}
	patched.Spec.Taints = WithTaint(node.Spec.Taints, want)
	why := "GPUs healthy again (or remediation off): taint lifted"
	if want != nil {
		patched.Annotations[AnnotationTaint] = want.Value
		why = "unhealthy GPU: " + want.Value
	}
	return r.w.Patch(ctx, patched, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}), why)
}

// managedList is the keys of the labels the labeller set on the node.
func managedList(node *metav1.PartialObjectMetadata) []string {
	v := node.Annotations[AnnotationManagedLabels]
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
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
