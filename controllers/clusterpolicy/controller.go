// Package clusterpolicy is the ClusterPolicy reconciler: it turns the
// ClusterPolicy in force into the GPU stack's operands (DaemonSets, their
// ServiceAccounts and RBAC, the device plugin's ConfigMap, the NVIDIA
// RuntimeClass), reports their rollout and the fleet's MIG state in the
// policy's status and metrics, and marks every other ClusterPolicy ignored.
//
// A pass observes the cache, computes the desired children (desired, a pure
// function of the policy), writes the difference through one apply.Writer,
// and writes the status that status (pure) computes.
package clusterpolicy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

// FieldOwner is the ClusterPolicy reconciler's field manager.
const FieldOwner = gpuv1alpha1.FieldOwnerClusterPolicy

// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies/status,verbs=get;patch
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=gpunodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=node.k8s.io,resources=runtimeclasses,verbs=get;list;watch;create;patch

// rbacKinds are the operands' RBAC kinds, cached as metadata only (Setup's
// Owns): a ClusterRole's rules are no reconciler's business once applied.
var rbacKinds = []schema.GroupKind{
	{Group: rbacv1.GroupName, Kind: "ClusterRole"},
	{Group: rbacv1.GroupName, Kind: "ClusterRoleBinding"},
	{Group: rbacv1.GroupName, Kind: "Role"},
	{Group: rbacv1.GroupName, Kind: "RoleBinding"},
}

// Reconciler turns the active ClusterPolicy into operand DaemonSets and
// reports their rollout component by component.
type Reconciler struct {
	client.Client
	Namespace string
	w         *apply.Writer
}

// New returns a reconciler writing through one writer as FieldOwner. The
// manager caches only Loom's ConfigMaps, ServiceAccounts and DaemonSets:
// live reads around the cache before a create find a foreign object of a
// child's name.
func New(c client.Client, live client.Reader, namespace string) *Reconciler {
	return &Reconciler{Client: c, Namespace: namespace,
		w: apply.NewWriter(c, FieldOwner, apply.Options{Live: live, Conditions: []string{conditionReady, conditionReconciling, conditionStalled}, MetadataOnly: rbacKinds})}
}

// Setup registers the ClusterPolicy reconciler.
func Setup(_ context.Context, mgr ctrl.Manager, opts manager.Options) error {
	r := New(mgr.GetClient(), mgr.GetAPIReader(), opts.Namespace)
	all := handler.EnqueueRequestsFromMapFunc(r.allPolicies)
	return ctrl.NewControllerManagedBy(mgr).
		Named("clusterpolicy").
		For(&gpuv1alpha1.ClusterPolicy{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, driverUpgradeChanged()))).
		// Which policy is in force (the oldest) changes for every policy
		// when one comes or goes: the one that was ignored takes over when
		// the one in force is deleted.
		Watches(&gpuv1alpha1.ClusterPolicy{}, all, builder.WithPredicates(policyCameOrWent())).
		Owns(&appsv1.DaemonSet{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&nodev1.RuntimeClass{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&rbacv1.ClusterRole{}, builder.OnlyMetadata).
		Owns(&rbacv1.ClusterRoleBinding{}, builder.OnlyMetadata).
		Owns(&rbacv1.Role{}, builder.OnlyMetadata).
		Owns(&rbacv1.RoleBinding{}, builder.OnlyMetadata).
		// GPU nodes coming and going, their upgrade and MIG labels and
		// failure annotations change the status; their OS and kernel pick
		// the driver's DaemonSets. One informer for all of it (typed Nodes
		// are cached trimmed, with nodeInfo's OS image and kernel): a
		// metadata informer beside it could show a node the typed one has
		// not seen yet.
		Watches(&corev1.Node{}, all, builder.WithPredicates(predicate.Or[client.Object](
			predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{}, nodeInfoChanged()))).
		// The content of the user ConfigMaps the policy names is hashed
		// onto the operands that read them.
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.policiesReading),
			builder.WithPredicates(configMapChanged(r.Namespace))).
		// MIG changes reported by the node agents change status.mig.
		Watches(&gpuv1alpha1.GPUNode{}, all, builder.WithPredicates(migChanged())).
		Complete(r)
}

func (r *Reconciler) allPolicies(ctx context.Context, _ client.Object) []reconcile.Request {
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

// Reconcile observes (cache), computes the desired children (pure),
// writes the difference, and writes status (pure) when it changed.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	if err := r.Get(ctx, req.NamespacedName, cp); err != nil {
		if apierrors.IsNotFound(err) {
			// Its children go by garbage collection, its gauges now.
			r.w.Forget(&gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: req.Name}})
			forgetMetrics(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if cp.DeletionTimestamp != nil {
		// Being deleted (a foreground deletion waits for its children): no
		// longer in force, nor ignored in favour of another. Its gauges go
		// now, so that no alert fires on what it last reported.
		forgetMetrics(cp.Name)
		return ctrl.Result{}, nil
	}
	obs, err := r.observe(ctx, cp)
	if err != nil {
		return ctrl.Result{}, err
	}
	if obs.active != cp.Name {
		_, err := r.w.Status(ctx, cp, &cp.Status, ignoredStatus(cp, obs.active))
		return ctrl.Result{}, err
	}
	p := desired(cp, r.Namespace, obs.cluster)
	obs.held, obs.noDriver = p.held, p.noDriver
	obs.untolerated = untoleratedTaints(cp, p.objects, labelled(obs.cluster.nodes, p.targets))
	// An invalid spec writes nothing: no operand half made (the RuntimeClass
	// and ServiceAccounts without the DaemonSet the API server refuses), no
	// running one changed or removed, until it is fixed.
	var writeErrs []string
	var relabel bool
	if obs.refused = r.refused(ctx, p); len(obs.refused) == 0 && len(cp.Spec.Validate()) == 0 {
		writeErrs, relabel = r.writeAll(ctx, cp, p, obs.cluster.nodes, obs.driverSets)
	}
	if obs.daemonSets, err = r.daemonSets(ctx, cp, p); err != nil {
		return ctrl.Result{}, err
	}
	st := status(cp, obs, writeErrs)
	recordMetrics(cp.Name, st)
	wait, err := r.w.Status(ctx, cp, &cp.Status, st, apply.CountsOnly(countsOnly(&cp.Status, st)))
	switch {
	case err != nil:
		return ctrl.Result{}, err
	case len(writeErrs) > 0:
		return ctrl.Result{}, fmt.Errorf("operands: %s", strings.Join(writeErrs, "; "))
	}
	if relabel && (wait == 0 || wait > time.Second) {
		wait = time.Second
	}
	return ctrl.Result{RequeueAfter: wait}, nil
}

// write ensures every wanted child and removes the policy's others,
// returning what failed. The RuntimeClass may belong to the toolkit or an
// admin: then it is theirs, and not a failure. Children refused because
// Loom's namespace is missing or being deleted are one failure, saying so,
// not one per child.
func (r *Reconciler) write(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, p plan, driverSets []string) []string {
	var errs []string
	var missing, terminating int
	for _, obj := range p.objects {
		err := r.w.Ensure(ctx, cp, obj)
		switch _, rc := obj.(*nodev1.RuntimeClass); {
		case rc && apply.IsForeign(err):
			// the toolkit's or an admin's
		case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			terminating++
		case isNamespaceNotFound(err, r.Namespace):
			missing++
		case err != nil:
			errs = append(errs, err.Error())
		}
	}
	for _, obj := range undesired(r.Namespace, p, driverSets) {
		if err := r.w.Remove(ctx, cp, obj); err != nil {
			errs = append(errs, err.Error())
		}
	}
	switch {
	case terminating > 0:
		errs = append([]string{fmt.Sprintf("namespace %s is being deleted: %d operand objects cannot be written in it until it is gone and created again", r.Namespace, terminating+missing)}, errs...)
	case missing > 0:
		errs = append([]string{fmt.Sprintf("namespace %s does not exist: %d operand objects are written once it is created", r.Namespace, missing)}, errs...)
	}
	return errs
}

// isNamespaceNotFound reports whether err is the API server's refusal of
// an object in the namespace ns because ns does not exist.
func isNamespaceNotFound(err error, ns string) bool {
	var status apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &status) {
		return false
	}
	d := status.Status().Details
	return d != nil && d.Kind == "namespaces" && d.Name == ns
}

// observe reads what the children and the status depend on beside the
// policy: the policy in force, the GPU nodes, the ConfigMaps the policy
// names, the driver's DaemonSets and the inventory of the nodes that exist.
func (r *Reconciler) observe(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy) (observed, error) {
	var obs observed
	policies := &gpuv1alpha1.ClusterPolicyList{}
	if err := r.List(ctx, policies); err != nil {
		return obs, err
	}
	if active := gpuv1alpha1.Active(policies.Items); active != nil {
		obs.active = active.Name
	}
	typed := &corev1.NodeList{}
	if err := r.List(ctx, typed, client.MatchingLabels{gpuv1alpha1.LabelPresent: "true"}); err != nil {
		return obs, err
	}
	nodes := make([]metav1.PartialObjectMetadata, len(typed.Items))
	for i := range typed.Items {
		nodes[i] = metav1.PartialObjectMetadata{ObjectMeta: typed.Items[i].ObjectMeta}
	}
	obs.gpuNodes, obs.upgrades, obs.migStates = int32(len(nodes)), countUpgrades(nodes, cp.Name), countMIGStates(nodes)
	obs.cluster.nodes = typed.Items
	var err error
	if obs.cluster.configMaps, err = r.configMaps(ctx, cp); err != nil {
		return obs, err
	}
	if obs.driverSets, err = r.driverSets(ctx, cp); err != nil {
		return obs, err
	}
	inventory := &gpuv1alpha1.GPUNodeList{}
	if err := r.List(ctx, inventory); err != nil {
		return obs, err
	}
	gpuNodes := map[string]bool{}
	for _, n := range nodes {
		gpuNodes[n.Name] = true
	}
	// A GPUNode without its Node (made by hand, or left behind) is no
	// node's inventory.
	for _, gn := range inventory.Items {
		if !gpuNodes[gn.Name] {
			exists, err := r.nodeExists(ctx, gn.Name)
			if err != nil {
				return obs, err
			}
			if !exists {
				continue
			}
		}
		obs.inventory = append(obs.inventory, gn)
	}
	return obs, nil
}

// nodeExists reads a Node's metadata from the cache.
func (r *Reconciler) nodeExists(ctx context.Context, name string) (bool, error) {
	n := &metav1.PartialObjectMetadata{}
	n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	err := r.Get(ctx, client.ObjectKey{Name: name}, n)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// daemonSets reads the wanted DaemonSets from the cache by operand; the
// driver's, one per OS, are summed into one.
func (r *Reconciler) daemonSets(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, p plan) (map[string]*appsv1.DaemonSet, error) {
	out := map[string]*appsv1.DaemonSet{}
	var driver []*appsv1.DaemonSet
	for _, obj := range p.objects {
		if _, ok := obj.(*appsv1.DaemonSet); !ok {
			continue
		}
		ds := &appsv1.DaemonSet{}
		err := r.Get(ctx, client.ObjectKeyFromObject(obj), ds)
		switch op := obj.GetLabels()[gpuv1alpha1.LabelComponent]; {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, err
		case op == gpuv1alpha1.OperandDriver:
			driver = append(driver, ds)
		default:
			out[op] = ds
		}
	}
	if len(driver) > 0 {
		out[gpuv1alpha1.OperandDriver] = sumDaemonSets(driver)
	}
	return out, nil
}

// configMaps reads the user ConfigMaps the policy names (Loom's namespace
// is cached whole); a missing one is left out.
func (r *Reconciler) configMaps(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy) (map[string]*corev1.ConfigMap, error) {
	out := map[string]*corev1.ConfigMap{}
	for _, n := range namedConfigMaps(cp) {
		cm := &corev1.ConfigMap{}
		err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: n.name}, cm)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, err
		default:
			out[n.name] = cm
		}
	}
	return out, nil
}

// driverSets names the policy's driver DaemonSets there are.
func (r *Reconciler) driverSets(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy) ([]string, error) {
	list := &appsv1.DaemonSetList{}
	if err := r.List(ctx, list, client.InNamespace(r.Namespace),
		client.MatchingLabels{gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver, gpuv1alpha1.LabelPolicy: cp.Name}); err != nil {
		return nil, err
	}
	var out []string
	for _, ds := range list.Items {
		out = append(out, ds.Name)
	}
	return out, nil
}

// policiesReading maps a ConfigMap of Loom's namespace to the policies
// that name it.
func (r *Reconciler) policiesReading(ctx context.Context, o client.Object) []reconcile.Request {
	list := &gpuv1alpha1.ClusterPolicyList{}
	if err := r.List(ctx, list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if referencesConfigMap(&list.Items[i], o.GetName()) {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
		}
	}
	return reqs
}

// countUpgrades sorts the GPU nodes the policy's driver upgrade enrolled
// (they carry its claim) by progress. Nodes with a state label but no claim
// (left by GPU Operator, say) or with a value Loom does not know are the
// driver upgrade's to name in its condition; they are not counted here.
func countUpgrades(nodes []metav1.PartialObjectMetadata, policy string) upgradeCounts {
	var u upgradeCounts
	why := map[string]string{}
	for _, n := range nodes {
		if n.Annotations[gpuv1alpha1.AnnotationClaim] != policy {
			continue
		}
		switch state := n.Labels[gpuv1alpha1.LabelUpgradeState]; {
		case state == "" || state == gpuv1alpha1.UpgradeDone || !gpuv1alpha1.KnownUpgradeState(state):
		case state == gpuv1alpha1.UpgradeFailed:
			u.failed = append(u.failed, n.Name)
			why[n.Name] = n.Annotations[gpuv1alpha1.AnnotationFailure]
		default:
			u.inProgress = append(u.inProgress, n.Name)
		}
	}
	sort.Strings(u.failed)
	if len(u.failed) > 0 {
		u.firstFailure = why[u.failed[0]]
	}
	return u
}

// driverUpgradeChanged passes ClusterPolicy updates whose DriverUpgrade
// condition (the driver upgrade controller's) changed: the driver
// component's message and Ready follow it.
func driverUpgradeChanged() predicate.Funcs {
	cond := func(o client.Object) string {
		cp, ok := o.(*gpuv1alpha1.ClusterPolicy)
		if !ok {
			return ""
		}
		if c := meta.FindStatusCondition(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade); c != nil {
			return string(c.Status) + c.Reason + c.Message
		}
		return ""
	}
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc:  func(e event.UpdateEvent) bool { return cond(e.ObjectOld) != cond(e.ObjectNew) },
	}
}

// policyCameOrWent passes ClusterPolicy creations and deletions, and the
// start of a deletion (deletionTimestamp set): they change which policy
// is in force.
func policyCameOrWent() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		DeleteFunc: func(event.DeleteEvent) bool { return true },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetDeletionTimestamp() == nil && e.ObjectNew.GetDeletionTimestamp() != nil
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// migChanged passes GPUNode events that change what summarizeMIG reads.
func migChanged() predicate.Funcs {
	key := func(o client.Object) string {
		gn, ok := o.(*gpuv1alpha1.GPUNode)
		if !ok {
			return ""
		}
		var b strings.Builder
		for _, g := range gn.Status.GPUs {
			if g.MIG == nil {
				continue
			}
			fmt.Fprintf(&b, "%v/%s/%s:", g.MIG.Capable, g.MIG.CurrentMode, g.MIG.PendingMode)
			for _, d := range g.MIG.Devices {
				b.WriteString(d.Profile + ",")
			}
			b.WriteString(";")
		}
		return b.String()
	}
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool { return key(e.ObjectOld) != key(e.ObjectNew) },
	}
}
