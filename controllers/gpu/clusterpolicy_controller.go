package gpu

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
	"github.com/loom-dev/loom/internal/coalesce"
	"github.com/loom-dev/loom/internal/manager"
)

// PolicyFieldOwner is the ClusterPolicy reconciler's field manager.
const PolicyFieldOwner = "loom-clusterpolicy"

// Reasons of the ClusterPolicy Ready condition.
const (
	ReasonAllReady        = "AllComponentsReady"
	ReasonComponentsWait  = "ComponentsNotReady"
	ReasonNoGPUNodes      = "NoGPUNodes"
	ReasonIgnored         = "AnotherPolicyActive"
	ReasonApplyFailed     = "ApplyFailed"
	conditionReady        = "Ready"
	componentStateReady   = "ready"
	componentStateWaiting = "notReady"
	componentStateOff     = "disabled"
)

// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies/status,verbs=get;patch
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=node.k8s.io,resources=runtimeclasses,verbs=get;list;watch;create;patch

// PolicyReconciler turns the active ClusterPolicy into operand DaemonSets
// and reports their rollout component by component.
type PolicyReconciler struct {
	client.Client
	Namespace string

	// applied remembers, per DaemonSet, the spec hash Loom applied and the
	// generation the server gave it: a cached DaemonSet with both unchanged
	// needs no write. A hand edit bumps the generation; a restart forgets and
	// costs one no-op apply per DaemonSet.
	mu      sync.Mutex
	applied map[string]appliedState
	writes  *coalesce.Writes // nil: no coalescing
}

type appliedState struct {
	hash       string
	generation int64
}

// SetupClusterPolicy registers the ClusterPolicy reconciler.
func SetupClusterPolicy(_ context.Context, mgr ctrl.Manager, opts manager.Options) error {
	r := &PolicyReconciler{Client: mgr.GetClient(), Namespace: opts.Namespace, applied: map[string]appliedState{}, writes: &coalesce.Writes{}}
	all := handler.EnqueueRequestsFromMapFunc(r.allPolicies)
	return ctrl.NewControllerManagedBy(mgr).
		Named("clusterpolicy").
		For(&gpuv1alpha1.ClusterPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.DaemonSet{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&nodev1.RuntimeClass{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&rbacv1.ClusterRole{}, builder.OnlyMetadata).
		Owns(&rbacv1.ClusterRoleBinding{}, builder.OnlyMetadata).
		Owns(&rbacv1.Role{}, builder.OnlyMetadata).
		Owns(&rbacv1.RoleBinding{}, builder.OnlyMetadata).
		// GPU nodes coming and going change the status's node count.
		WatchesMetadata(&corev1.Node{}, all, builder.WithPredicates(metadataChanged())).
		// MIG changes reported by the node agents change status.mig.
		Watches(&gpuv1alpha1.GPUNode{}, all, builder.WithPredicates(migChanged())).
		Complete(r)
}

func (r *PolicyReconciler) allPolicies(ctx context.Context, _ client.Object) []reconcile.Request {
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

// Reconcile observes (cache), computes the desired operands (pure), applies
// the difference, and writes status when it changed.
func (r *PolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	if err := r.Get(ctx, req.NamespacedName, cp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err) // children go by garbage collection
	}
	active, err := r.activePolicy(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	status := cp.Status.DeepCopy()
	status.ObservedGeneration = cp.Generation
	if active != cp.Name {
		status.State, status.ActivePolicy, status.Components = gpuv1alpha1.PolicyIgnored, active, nil
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: conditionReady, Status: metav1.ConditionFalse,
			Reason: ReasonIgnored, ObservedGeneration: cp.Generation,
			Message: fmt.Sprintf("ClusterPolicy %s is in force (the oldest); this one is ignored", active)})
		return ctrl.Result{}, r.writeStatus(ctx, cp, status)
	}
	status.ActivePolicy = ""

	gpuNodes, upgrades, err := r.countGPUNodes(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	status.GPUNodes = gpuNodes
	on, off := enabledOperands(cp)
	var applyErrs []string
	if err := r.ensureRuntimeClass(ctx, cp); err != nil {
		applyErrs = append(applyErrs, fmt.Sprintf("RuntimeClass %s: %v", RuntimeClassName, err))
	}
	for _, op := range on {
		if err := r.ensureOperand(ctx, cp, op); err != nil {
			applyErrs = append(applyErrs, fmt.Sprintf("%s: %v", op.name, err))
		}
	}
	for _, op := range off {
		if err := r.removeOperand(ctx, op); err != nil {
			applyErrs = append(applyErrs, fmt.Sprintf("%s: %v", op.name, err))
		}
	}
	if err := r.ensureDevicePluginConfig(ctx, cp); err != nil {
		applyErrs = append(applyErrs, fmt.Sprintf("device plugin config: %v", err))
	}
	status.Components = r.components(ctx, cp, on, off, upgrades)
	mig, err := r.migSummary(ctx, cp, upgrades.migFailed)
	if err != nil {
		return ctrl.Result{}, err
	}
	status.MIG = mig
	computeState(status, gpuNodes, applyErrs, cp.Generation)
	recordMetrics(cp.Name, status, upgrades)
	if wait := r.coalesce(cp, status); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	if err := r.writeStatus(ctx, cp, status); err != nil {
		return ctrl.Result{}, err
	}
	if len(applyErrs) > 0 {
		return ctrl.Result{}, fmt.Errorf("operands: %s", strings.Join(applyErrs, "; "))
	}
	return ctrl.Result{}, nil
}

// activePolicy is the oldest ClusterPolicy (name breaks ties).
func (r *PolicyReconciler) activePolicy(ctx context.Context) (string, error) {
	cp, err := ActivePolicy(ctx, r.Client)
	if cp == nil || err != nil {
		return "", err
	}
	return cp.Name, nil
}

// ActivePolicy returns the ClusterPolicy in force (gpuv1alpha1.Active), or
// nil.
func ActivePolicy(ctx context.Context, c client.Reader) (*gpuv1alpha1.ClusterPolicy, error) {
	list := &gpuv1alpha1.ClusterPolicyList{}
	if err := c.List(ctx, list); err != nil {
		return nil, err
	}
	return gpuv1alpha1.Active(list.Items), nil
}

// upgradeCounts are the GPU nodes by driver upgrade progress.
type upgradeCounts struct {
	inProgress, failed []string
	// firstFailure is why the first failed node (by name) failed.
	firstFailure string
	// migFailed are nodes whose MIG manager reports a failed layout.
	migFailed []string
}

func (r *PolicyReconciler) countGPUNodes(ctx context.Context) (int32, upgradeCounts, error) {
	var u upgradeCounts
	nodes := &metav1.PartialObjectMetadataList{}
	nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := r.List(ctx, nodes, client.MatchingLabels{LabelPresent: "true"}); err != nil {
		return 0, u, err
	}
	for _, n := range nodes.Items {
		if n.Labels[LabelMIGConfigState] == "failed" {
			u.migFailed = append(u.migFailed, n.Name)
		}
		switch n.Labels[LabelUpgradeState] {
		case "", UpgradeDone:
		case UpgradeFailed:
			u.failed = append(u.failed, n.Name)
		default:
			u.inProgress = append(u.inProgress, n.Name)
		}
	}
	sort.Strings(u.failed)
	for _, n := range nodes.Items {
		if len(u.failed) > 0 && n.Name == u.failed[0] {
			u.firstFailure = n.Annotations[AnnotationFailure]
		}
	}
	return int32(len(nodes.Items)), u, nil
}

func (r *PolicyReconciler) ensureOperand(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, op operand) error {
	owner := []metav1.OwnerReference{*metav1.NewControllerRef(cp, gpuv1alpha1.GroupVersion.WithKind("ClusterPolicy"))}
	name := objectName(op.name)

	sa := &corev1.ServiceAccount{}
	err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, sa)
	if apierrors.IsNotFound(err) {
		want := &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.Namespace, Labels: operandLabels(op.name, cp), OwnerReferences: owner}}
		if err := r.apply(ctx, want); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}

	if err := r.ensureOperandRBAC(ctx, cp, op.name); err != nil {
		return err
	}

	ds := BuildDaemonSet(op, cp, r.Namespace)
	ds.OwnerReferences = owner
	hash := hashOf(ds.Spec)
	ds.Annotations = map[string]string{AnnotationSpecHash: hash}
	cur := &appsv1.DaemonSet{}
	err = r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, cur)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	r.mu.Lock()
	last, known := r.applied[name]
	r.mu.Unlock()
	if err == nil && known && last.hash == hash && cur.Annotations[AnnotationSpecHash] == hash && cur.Generation == last.generation {
		return nil // the cache shows exactly what we applied
	}
	got, err := r.applyDaemonSet(ctx, ds)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.applied[name] = appliedState{hash: hash, generation: got}
	r.mu.Unlock()
	return nil
}

// ensureRuntimeClass creates the nvidia RuntimeClass the operands after the
// toolkit run under, unless it exists (the toolkit or an admin may own it).
func (r *PolicyReconciler) ensureRuntimeClass(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy) error {
	err := r.Get(ctx, client.ObjectKey{Name: RuntimeClassName}, &nodev1.RuntimeClass{})
	if !apierrors.IsNotFound(err) {
		return err
	}
	return r.apply(ctx, &nodev1.RuntimeClass{
		TypeMeta: metav1.TypeMeta{APIVersion: "node.k8s.io/v1", Kind: "RuntimeClass"},
		ObjectMeta: metav1.ObjectMeta{Name: RuntimeClassName, Labels: map[string]string{LabelManagedBy: managedBy},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cp, gpuv1alpha1.GroupVersion.WithKind("ClusterPolicy"))}},
		Handler: RuntimeClassName,
	})
}

// ensureDevicePluginConfig writes the time-slicing ConfigMap when the
// policy has inline time-slicing and the device plugin runs, and removes it
// otherwise. The cache decides whether a write is needed.
func (r *PolicyReconciler) ensureDevicePluginConfig(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy) error {
	want := DevicePluginConfigMap(cp, r.Namespace)
	if !cp.Spec.DevicePlugin.IsEnabled(defaultsFor(gpuv1alpha1.OperandDevicePlugin)) {
		want = nil
	}
	cur := &corev1.ConfigMap{}
	err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: devicePluginConfigName}, cur)
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return err
	case want == nil && err == nil && cur.Labels[LabelManagedBy] == managedBy:
		return client.IgnoreNotFound(r.Delete(ctx, cur))
	case want == nil:
		return nil
	case err == nil && apiequality.Semantic.DeepEqual(cur.Data, want.Data) && metav1.IsControlledBy(cur, cp):
		return nil
	}
	want.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(cp, gpuv1alpha1.GroupVersion.WithKind("ClusterPolicy"))}
	return r.apply(ctx, want)
}

func (r *PolicyReconciler) removeOperand(ctx context.Context, op operand) error {
	name := objectName(op.name)
	for _, obj := range []client.Object{&appsv1.DaemonSet{}, &corev1.ServiceAccount{}} {
		err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, obj)
		if apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return err
		}
		if obj.GetLabels()[LabelManagedBy] != managedBy {
			continue // not ours
		}
		if err := r.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	r.mu.Lock()
	delete(r.applied, name)
	r.mu.Unlock()
	return r.removeOperandRBAC(ctx, op.name)
}

func (r *PolicyReconciler) apply(ctx context.Context, obj runtime.Object) error {
	_, err := apply.Apply(ctx, r.Client, obj, PolicyFieldOwner)
	return err
}

// applyDaemonSet applies and returns the generation the server reports.
func (r *PolicyReconciler) applyDaemonSet(ctx context.Context, ds *appsv1.DaemonSet) (int64, error) {
	got, err := apply.Apply(ctx, r.Client, ds, PolicyFieldOwner)
	if err != nil {
		return 0, err
	}
	return got.GetGeneration(), nil
}

func (r *PolicyReconciler) components(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, on, off []operand, upgrades upgradeCounts) []gpuv1alpha1.ComponentStatus {
	var out []gpuv1alpha1.ComponentStatus
	for _, op := range on {
		_, ref := cp.Spec.Operand(op.name).EffectiveImage(defaultsFor(op.name))
		c := gpuv1alpha1.ComponentStatus{Name: op.name, Enabled: true, State: componentStateWaiting, Version: ref[strings.LastIndex(ref, ":")+1:]}
		ds := &appsv1.DaemonSet{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: objectName(op.name)}, ds); err != nil {
			c.Message = "DaemonSet " + objectName(op.name) + " not created yet"
			out = append(out, c)
			continue
		}
		c.Desired, c.Ready = ds.Status.DesiredNumberScheduled, ds.Status.NumberReady
		switch {
		case ds.Status.ObservedGeneration < ds.Generation:
			c.Message = "DaemonSet controller has not seen the latest spec yet"
		case c.Desired == 0:
			c.Message = "no GPU node to run on (nodes need nvidia.com/gpu.present=true, and no nvidia.com/gpu.deploy." + op.name + "=false)"
		case c.Ready < c.Desired:
			c.Message = fmt.Sprintf("%d of %d pods ready", c.Ready, c.Desired)
		case op.onDelete || ds.Status.UpdatedNumberScheduled >= c.Desired:
			c.State, c.Message = componentStateReady, fmt.Sprintf("ready on %d nodes", c.Ready)
		default:
			c.Message = fmt.Sprintf("rolling out: %d of %d pods updated", ds.Status.UpdatedNumberScheduled, c.Desired)
		}
		if op.name == gpuv1alpha1.OperandDriver && (len(upgrades.inProgress) > 0 || len(upgrades.failed) > 0) {
			c.State = componentStateWaiting
			c.Message = fmt.Sprintf("upgrading: %d nodes in progress, %d failed", len(upgrades.inProgress), len(upgrades.failed))
			if len(upgrades.failed) > 0 {
				c.Message += fmt.Sprintf(" (%s; see label %s)", strings.Join(upgrades.failed, ", "), LabelUpgradeState)
				if upgrades.firstFailure != "" {
					c.Message += fmt.Sprintf("; %s: %s", upgrades.failed[0], upgrades.firstFailure)
				}
			}
		}
		out = append(out, c)
	}
	for _, op := range off {
		out = append(out, gpuv1alpha1.ComponentStatus{Name: op.name, State: componentStateOff})
	}
	return out
}

// computeState sets state and the Ready condition from the components.
func computeState(st *gpuv1alpha1.ClusterPolicyStatus, gpuNodes int32, applyErrs []string, generation int64) {
	cond := metav1.Condition{Type: conditionReady, ObservedGeneration: generation}
	var waiting []string
	for _, c := range st.Components {
		if c.Enabled && c.State != componentStateReady {
			waiting = append(waiting, c.Name+" ("+c.Message+")")
		}
	}
	switch {
	case len(applyErrs) > 0:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonApplyFailed, strings.Join(applyErrs, "; ")
	case gpuNodes == 0:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonNoGPUNodes,
			"no node has GPUs yet (label nvidia.com/gpu.present=true, set from the node agent's inventory)"
	case len(waiting) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonComponentsWait
		cond.Message = fmt.Sprintf("%d of %d components not ready: %s", len(waiting), countEnabled(st.Components), strings.Join(waiting, ", "))
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonAllReady
		cond.Message = fmt.Sprintf("%d components ready on %d GPU nodes", countEnabled(st.Components), gpuNodes)
	}
	st.State = gpuv1alpha1.PolicyNotReady
	if cond.Status == metav1.ConditionTrue {
		st.State = gpuv1alpha1.PolicyReady
	}
	meta.SetStatusCondition(&st.Conditions, cond)
}

func countEnabled(cs []gpuv1alpha1.ComponentStatus) int {
	n := 0
	for _, c := range cs {
		if c.Enabled {
			n++
		}
	}
	return n
}

// coalesce returns how long to hold a status write that changes only
// counts and messages, so that a large rollout costs one status write per
// coalesce.Interval instead of one per DaemonSet status change (a rollout on
// 500 nodes changes DaemonSet status thousands of times).
func (r *PolicyReconciler) coalesce(cp *gpuv1alpha1.ClusterPolicy, st *gpuv1alpha1.ClusterPolicyStatus) time.Duration {
	if r.writes == nil || st.State != cp.Status.State || st.GPUNodes != cp.Status.GPUNodes || st.ObservedGeneration != cp.Status.ObservedGeneration ||
		!coalesce.SameConditions(cp.Status.Conditions, st.Conditions) {
		return 0
	}
	for _, c := range st.Components {
		found := false
		for _, o := range cp.Status.Components {
			if o.Name == c.Name {
				found = true
				if o.State != c.State || o.Enabled != c.Enabled || o.Version != c.Version {
					return 0
				}
			}
		}
		if !found {
			return 0
		}
	}
	return r.writes.Wait(client.ObjectKeyFromObject(cp))
}

func (r *PolicyReconciler) writeStatus(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, st *gpuv1alpha1.ClusterPolicyStatus) error {
	if apiequality.Semantic.DeepEqual(&cp.Status, st) {
		return nil
	}
	if err := apply.Status(ctx, r.Client, cp, st, PolicyFieldOwner); err != nil {
		return fmt.Errorf("writing ClusterPolicy status: %w", err)
	}
	cp.Status = *st
	if r.writes != nil {
		r.writes.Wrote(client.ObjectKeyFromObject(cp))
	}
	return nil
}

// migSummary summarizes MIG over the GPUNodes in the cache.
func (r *PolicyReconciler) migSummary(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, failed []string) (*gpuv1alpha1.MIGSummary, error) {
	list := &gpuv1alpha1.GPUNodeList{}
	if err := r.List(ctx, list); err != nil {
		return nil, err
	}
	m := summarizeMIG(list.Items, failed)
	m.Strategy = cp.Spec.MIG.Strategy
	if m.Strategy == "" {
		m.Strategy = gpuv1alpha1.MIGStrategySingle
	}
	return m, nil
}

// summarizeMIG counts MIG-capable, MIG-enabled and pending nodes and the
// devices by profile; node lists are sorted and capped at 20.
func summarizeMIG(nodes []gpuv1alpha1.GPUNode, failed []string) *gpuv1alpha1.MIGSummary {
	m := &gpuv1alpha1.MIGSummary{}
	for i := range nodes {
		capable, enabled, pending := false, false, false
		for _, g := range nodes[i].Status.GPUs {
			if g.MIG == nil {
				continue
			}
			capable = capable || g.MIG.Capable
			enabled = enabled || g.MIG.CurrentMode == gpuv1alpha1.MIGEnabled
			pending = pending || (g.MIG.PendingMode != "" && g.MIG.PendingMode != g.MIG.CurrentMode)
			if g.MIG.CurrentMode == gpuv1alpha1.MIGEnabled {
				for _, d := range g.MIG.Devices {
					if m.Devices == nil {
						m.Devices = map[string]int32{}
					}
					m.Devices[d.Profile]++
				}
			}
		}
		if capable {
			m.CapableNodes++
		}
		if enabled {
			m.EnabledNodes++
		}
		if pending {
			m.PendingNodes = append(m.PendingNodes, nodes[i].Name)
		}
	}
	sort.Strings(m.PendingNodes)
	m.PendingNodes = capList(m.PendingNodes)
	m.FailedNodes = capList(append([]string(nil), failed...))
	return m
}

func capList(s []string) []string {
	sort.Strings(s)
	if len(s) > 20 {
		return s[:20]
	}
	return s
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
