// Package driverupgrade rolls a new NVIDIA driver out node by node, as GPU
// Operator's upgrade controller does: cordon, wait for the jobs the policy
// names, evict the GPU pods (eviction API, so disruption budgets hold),
// optionally drain, replace the node's driver pod, wait for it to be ready,
// uncordon. Progress lives in the node label
// nvidia.com/gpu-driver-upgrade-state (GPU Operator's values) and the
// node's annotations, so a manager restart resumes where it stopped. Loom
// steps only the nodes it enrolled: those carrying its claim annotation,
// written with the first state and the cordon in one patch conditional on
// the node's resourceVersion.
//
// A pass is keyed by the ClusterPolicy. plan (pure) picks the nodes it
// advances within the policy's budget and failure bound; next (pure) is
// one node's transition, from its state, driver pod, its target (the
// template of the driver DaemonSet owning that pod), its pods and the
// clock to its next state and the actions that get it there; the
// reconciler observes, calls them and executes the actions; status (pure)
// is the policy's DriverUpgrade condition.
package driverupgrade

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
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

// FieldOwner names the driver upgrade's writes
// (gpuv1alpha1.FieldOwnerDriverUpgrade).
const FieldOwner = gpuv1alpha1.FieldOwnerDriverUpgrade

// requeue is how soon a pass with upgrades in progress runs again.
const requeue = 3 * time.Second

// readyRecheck is how often a pass looks for a failed node to retry (lost
// after too long NotReady, or on a new template) being Ready again, when
// nothing else brings one.
const readyRecheck = 30 * time.Second

// placingDelay coalesces the passes that recount nodes whose driver pod the
// DaemonSet is still placing: at most one per policy this often, and only
// while the DaemonSet places pods.
const placingDelay = time.Second

// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies/status,verbs=get;patch
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;delete
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create

// Reconciler advances the driver upgrades of the GPU nodes.
type Reconciler struct {
	client.Client
	// Reader reads nodes and pods straight from the API server: the
	// manager does not cache every pod for a rare upgrade, and the budget
	// must be counted from the nodes as they are, not as a lagging cache
	// has them.
	Reader    client.Reader
	Namespace string
	// Now is the clock the waits and timeouts are measured by.
	Now func() time.Time
	// Recorder, when set, gets a Node event at every step (reason
	// GPUDriverUpgrade, as GPU Operator's upgrade library emits, so
	// existing runbooks and alerts keep working).
	Recorder recorder.EventRecorder
	w        *apply.Writer
	// placing are the policies whose last pass counted nodes waiting for
	// their driver pod, or nodes on an older driver that autoUpgrade: false
	// leaves to a person: for them, a driver DaemonSet placing pods is
	// worth a (delayed, coalesced) pass, so that the DriverUpgrade count
	// converges without polling (a driver pod deleted by hand is replaced
	// from the new template, and the node counted up to date).
	placing placingSet
}

// placingSet is a set of policy names, safe for the event handlers.
type placingSet struct {
	mu    sync.Mutex
	names map[string]bool
}

func (p *placingSet) set(name string, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.names == nil {
		p.names = map[string]bool{}
	}
	if on {
		p.names[name] = true
	} else {
		delete(p.names, name)
	}
}

func (p *placingSet) has(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.names[name]
}

// scheduledWhilePlacing enqueues, after placingDelay, the policy owning a
// driver DaemonSet whose scheduled pod counts changed while that policy counts nodes
// waiting for their driver pod. Otherwise DaemonSet status churn costs
// nothing: an idle cluster makes no pass.
func (r *Reconciler) scheduledWhilePlacing() handler.EventHandler {
	return handler.Funcs{UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		oldDS, ok1 := e.ObjectOld.(*appsv1.DaemonSet)
		newDS, ok2 := e.ObjectNew.(*appsv1.DaemonSet)
		if !ok1 || !ok2 || scheduled(oldDS) == scheduled(newDS) {
			return
		}
		for _, req := range ownerPolicy(ctx, newDS) {
			if r.placing.has(req.Name) {
				q.AddAfter(req, placingDelay)
			}
		}
	}}
}

func scheduled(ds *appsv1.DaemonSet) [3]int32 {
	return [3]int32{ds.Status.CurrentNumberScheduled, ds.Status.UpdatedNumberScheduled, ds.Status.DesiredNumberScheduled}
}

// New returns a reconciler of Loom's namespace on the wall clock.
func New(c client.Client, reader client.Reader, namespace string) *Reconciler {
	return &Reconciler{Client: c, Reader: reader, Namespace: namespace, Now: time.Now,
		w: apply.NewWriter(c, FieldOwner, apply.Options{Conditions: []string{gpuv1alpha1.ConditionDriverUpgrade}})}
}

// Setup registers the driver upgrade controller. A pass is keyed by the
// ClusterPolicy; driver DaemonSets map to the policy that owns them, nodes
// to the policy that claimed them (or to every policy).
func Setup(_ context.Context, mgr ctrl.Manager, opts manager.Options) error {
	r := New(mgr.GetClient(), mgr.GetAPIReader(), opts.Namespace)
	r.Recorder = mgr.GetEventRecorder(FieldOwner)
	isDriver := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == opts.Namespace && o.GetLabels()[gpuv1alpha1.LabelComponent] == gpuv1alpha1.OperandDriver
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("driver-upgrade").
		// A new version, a changed upgrade policy, a resume annotation,
		// a deletion; not this controller's own condition writes.
		For(&gpuv1alpha1.ClusterPolicy{}, builder.WithPredicates(
			predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		// Only a new template starts upgrades; while one runs, the
		// reconciler requeues itself. DaemonSet status churn (every pod of a
		// rollout) would otherwise cost a pod list each.
		Watches(&appsv1.DaemonSet{}, handler.EnqueueRequestsFromMapFunc(ownerPolicy),
			builder.WithPredicates(isDriver, predicate.GenerationChangedPredicate{})).
		Watches(&appsv1.DaemonSet{}, r.scheduledWhilePlacing(), builder.WithPredicates(isDriver)).
		WatchesMetadata(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.nodePolicies), builder.WithPredicates(nodeChanged())).
		Complete(r)
}

// ownerPolicy maps a driver DaemonSet to the ClusterPolicy controlling it.
func ownerPolicy(_ context.Context, o client.Object) []reconcile.Request {
	if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "ClusterPolicy" {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: ref.Name}}}
	}
	return nil
}

// nodePolicies maps a node to the policy that claimed it, or to every
// policy (a node that may start, or carries a label Loom reports).
func (r *Reconciler) nodePolicies(ctx context.Context, o client.Object) []reconcile.Request {
	if claim := o.GetAnnotations()[gpuv1alpha1.AnnotationClaim]; claim != "" {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: claim}}}
	}
	list := &gpuv1alpha1.ClusterPolicyList{}
	if err := r.List(ctx, list); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		reqs[i] = reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}}
	}
	return reqs
}

// nodeChanged passes a node's state label, claim or GPU presence
// changing, and every claimed or labelled node the informer lists (a
// restarted manager resumes, and lets go of nodes a deleted policy left).
func nodeChanged() predicate.Funcs {
	key := func(o client.Object) string {
		return o.GetLabels()[gpuv1alpha1.LabelUpgradeState] + "|" + o.GetAnnotations()[gpuv1alpha1.AnnotationClaim] + "|" +
			o.GetLabels()[gpuv1alpha1.LabelPresent]
	}
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool { return key(e.ObjectOld) != key(e.ObjectNew) },
		CreateFunc: func(e event.CreateEvent) bool {
			return e.Object.GetAnnotations()[gpuv1alpha1.AnnotationClaim] != "" || e.Object.GetLabels()[gpuv1alpha1.LabelUpgradeState] != ""
		},
		DeleteFunc: func(event.DeleteEvent) bool { return false },
	}
}

// observed is what a pass reads.
type observed struct {
	// cp is the policy (nil: deleted).
	cp *gpuv1alpha1.ClusterPolicy
	// release: the policy is gone, being deleted, or runs no driver.
	release bool
	// daemonSets counts the policy's driver DaemonSets.
	daemonSets int
	// nodes is the node set, sorted by name.
	nodes []nodeView
	// gpus are the resources GPUs are advertised under (the policy's
	// sharing renames included): a pod asking for one is a GPU pod.
	gpus sharing.Names
}

// Reconcile advances every node's upgrade by at most one step, starts new
// ones within the policy's budget, and writes the policy's DriverUpgrade
// condition. One node's failure never stops another's step.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obs, err := r.observe(ctx, req.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	var pl planned
	if obs.cp != nil {
		pl = plan(obs.nodes, obs.cp.Spec.Driver.UpgradePolicy, req.Name, obs.cp.Annotations[gpuv1alpha1.AnnotationResume] != "")
		recordGauges(req.Name, pl.summary)
	} else {
		forgetGauges(req.Name)
	}
	if obs.release {
		pl = planned{todo: claimedBy(obs.nodes, req.Name)}
		pl.more = len(pl.todo) > 0
	}
	retry, errs := r.step(ctx, obs, req.Name, pl.todo)
	r.placing.set(req.Name, obs.cp != nil && pl.summary.awaitsDriverPods())
	if obs.cp != nil && obs.cp.DeletionTimestamp == nil {
		errs = append(errs, r.acknowledge(ctx, obs.cp, pl)...)
		if err := r.status(ctx, obs, pl); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	switch {
	case pl.more || retry:
		return ctrl.Result{RequeueAfter: requeue}, nil
	case pl.awaitsReady:
		return ctrl.Result{RequeueAfter: readyRecheck}, nil
	}
	return ctrl.Result{}, nil
}

// claimedBy are the work items of a release: every node claim enrolled.
func claimedBy(nodes []nodeView, claim string) []work {
	var todo []work
	for _, v := range nodes {
		if v.node.Annotations[gpuv1alpha1.AnnotationClaim] == claim {
			todo = append(todo, work{node: v.node.Name})
		}
	}
	return todo
}

// observe reads the policy (cache), its driver DaemonSets (cache), the
// driver pods and the nodes (API server).
func (r *Reconciler) observe(ctx context.Context, name string) (observed, error) {
	var obs observed
	cp := &gpuv1alpha1.ClusterPolicy{}
	switch err := r.Get(ctx, client.ObjectKey{Name: name}, cp); {
	case apierrors.IsNotFound(err):
		obs.release = true
	case err != nil:
		return obs, err
	default:
		obs.cp = cp
		obs.release = cp.DeletionTimestamp != nil || !cp.Spec.OperandEnabled(gpuv1alpha1.OperandDriver)
		src, err := sharing.Read(ctx, r.Client, cp, r.Namespace)
		if err != nil {
			return obs, err
		}
		obs.gpus = sharing.NamesOf(src)
	}
	templates := map[string]string{}
	specs := map[string]corev1.PodSpec{}
	if obs.cp != nil {
		list := &appsv1.DaemonSetList{}
		if err := r.List(ctx, list, client.InNamespace(r.Namespace), client.MatchingLabels{gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}); err != nil {
			return obs, err
		}
		for _, ds := range list.Items {
			if ref := metav1.GetControllerOf(&ds); ref != nil && ref.UID == cp.UID {
				templates[ds.Name] = ds.Spec.Template.Annotations[gpuv1alpha1.AnnotationTemplateHash]
				specs[ds.Name] = ds.Spec.Template.Spec
			}
		}
		obs.daemonSets = len(templates)
	}
	drivers, err := r.driverPods(ctx)
	if err != nil {
		return obs, err
	}
	obs.nodes, err = r.nodeSet(ctx, drivers, templates, specs, obs.cp != nil && obs.cp.Spec.Driver.UsePrecompiled)
	return obs, err
}

// nodeSet is every node carrying the upgrade's claim or state label, the
// nodes labelled GPU-present and those running a driver pod, whether or
// not they are labelled present right now, each with its driver pod and
// its target (the template of the DaemonSet that owns that pod); a node is
// marked unplaced when it left the driver DaemonSets' placement
// (driverLeft): not while its OS's DaemonSet is missing (being created, or
// deleted and recreated), which may be back in a moment, and its nodes
// must not leave their upgrades for that. specs are the pod specs of the
// policy's driver DaemonSets by name.
func (r *Reconciler) nodeSet(ctx context.Context, drivers map[string][]*corev1.Pod, templates map[string]string, specs map[string]corev1.PodSpec,
	precompiled bool) ([]nodeView, error) {
	list := &corev1.NodeList{}
	if err := r.Reader.List(ctx, list); err != nil {
		return nil, err
	}
	all := make([]corev1.PodSpec, 0, len(specs))
	for _, spec := range specs {
		all = append(all, spec)
	}
	var out []nodeView
	for i := range list.Items {
		n := &list.Items[i]
		driver := driverOf(drivers[n.Name], n, specs)
		_, labelled := n.Labels[gpuv1alpha1.LabelUpgradeState]
		if !labelled && driver == nil && n.Labels[gpuv1alpha1.LabelPresent] != "true" && n.Annotations[gpuv1alpha1.AnnotationClaim] == "" {
			continue
		}
		v := nodeView{node: n, driver: driver, unplaced: driverLeft(all, n, precompiled)}
		if driver != nil {
			if ref := metav1.GetControllerOf(driver); ref != nil && ref.Kind == "DaemonSet" {
				v.target = templates[ref.Name]
			}
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].node.Name < out[j].node.Name })
	return out, nil
}

// driverPods are the driver pods by node, not being deleted.
func (r *Reconciler) driverPods(ctx context.Context) (map[string][]*corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := r.Reader.List(ctx, pods, client.InNamespace(r.Namespace),
		client.MatchingLabels{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}); err != nil {
		return nil, err
	}
	out := map[string][]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = append(out[p.Spec.NodeName], p)
		}
	}
	return out, nil
}

// driverOf is the node's driver pod among its pods, the one of the driver
// DaemonSet that places the node (specs, by DaemonSet name). A node whose
// OS changed runs two for a while: the old OS's DaemonSet's, until the
// DaemonSet controller deletes it, and the new OS's; both DaemonSets may
// even name the node until the ClusterPolicy has updated them all. A pod
// of a DaemonSet placing the node comes first, then the newest pod, then
// the name, so the choice does not hang on the order of a list.
func driverOf(pods []*corev1.Pod, n *corev1.Node, specs map[string]corev1.PodSpec) *corev1.Pod {
	places := func(p *corev1.Pod) bool {
		ref := metav1.GetControllerOf(p)
		if ref == nil || ref.Kind != "DaemonSet" {
			return false
		}
		spec, ok := specs[ref.Name]
		return ok && driverPlaces([]corev1.PodSpec{spec}, n)
	}
	better := func(a, b *corev1.Pod) bool {
		if pa, pb := places(a), places(b); pa != pb {
			return pa
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return b.CreationTimestamp.Before(&a.CreationTimestamp)
		}
		return a.Name > b.Name
	}
	var best *corev1.Pod
	for _, p := range pods {
		if best == nil || better(p, best) {
			best = p
		}
	}
	return best
}

// step advances each work item's node on its own: an error is collected,
// and a conflict (the node changed since it was read) retried next pass,
// as is a node deleted since: the next pass's set no longer has it.
func (r *Reconciler) step(ctx context.Context, obs observed, claim string, todo []work) (retry bool, errs []error) {
	byName := map[string]nodeView{}
	for _, v := range obs.nodes {
		byName[v.node.Name] = v
	}
	t := target{claim: claim, namespace: r.Namespace, release: obs.release, gpus: obs.gpus}
	if obs.cp != nil {
		t.policy = obs.cp.Spec.Driver.UpgradePolicy
	}
	for _, w := range todo {
		v := byName[w.node]
		t.start, t.template, t.release = w.start, v.template(), obs.release || w.leave
		why := ""
		switch {
		case obs.release:
			why = releasedPolicy
		case w.leave:
			why = releasedUnplaced
		}
		err := r.advance(ctx, v, t, why)
		switch {
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			retry = true
		case err != nil:
			errs = append(errs, fmt.Errorf("node %s: %w", w.node, err))
		}
	}
	return retry, errs
}

// advance reads the node's pods when its state needs them, computes its
// transition and executes it; released says why a release lets go of the
// node.
func (r *Reconciler) advance(ctx context.Context, v nodeView, t target, released string) error {
	var pods []corev1.Pod
	from := v.node.Labels[gpuv1alpha1.LabelUpgradeState]
	if needsPods(from) && !t.release {
		list := &corev1.PodList{}
		if err := r.Reader.List(ctx, list, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", v.node.Name)}); err != nil {
			return err
		}
		pods = list.Items
	}
	state, actions := next(v.node, v.driver, pods, t, r.Now())
	if err := r.execute(ctx, v.node, actions); err != nil {
		return err
	}
	if state != from || len(actions) > 0 && t.release {
		log.FromContext(ctx).Info("driver upgrade", "node", v.node.Name, "from", from, "to", state, "released", released)
		r.event(v.node, from, state, released)
	}
	for _, a := range actions {
		if a.warning != "" {
			log.FromContext(ctx).Info("driver upgrade: "+a.warning, "node", v.node.Name, "state", from)
			r.warn(v.node, a.warning)
		}
	}
	return nil
}
