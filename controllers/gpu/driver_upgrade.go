package gpu

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
)

// The per-node driver upgrade state, in GPU Operator's label and values.
const (
	LabelUpgradeState = "nvidia.com/gpu-driver-upgrade-state"

	UpgradeRequired     = "upgrade-required"
	WaitForJobsRequired = "wait-for-jobs-required"
	PodDeletionRequired = "pod-deletion-required"
	DrainRequired       = "drain-required"
	PodRestartRequired  = "pod-restart-required"
	ValidationRequired  = "validation-required"
	UncordonRequired    = "uncordon-required"
	UpgradeDone         = "upgrade-done"
	UpgradeFailed       = "upgrade-failed"

	// AnnotationWasCordoned marks a node someone else had cordoned before its
	// upgrade: it stays cordoned afterwards.
	AnnotationWasCordoned = "gpu.loom.dev/driver-upgrade-was-cordoned"
	// AnnotationUpgradeStarted is when the node's upgrade began (RFC 3339).
	AnnotationUpgradeStarted = "gpu.loom.dev/driver-upgrade-started"
	// AnnotationPhaseStarted is when the node entered its current state:
	// the waits and timeouts of each state count from it.
	AnnotationPhaseStarted = "gpu.loom.dev/driver-upgrade-phase-started"
	// AnnotationFailure says why a node's upgrade failed; the node stays
	// cordoned and in upgrade-failed until a new driver version (a new
	// template) is rolled out, which retries it.
	AnnotationFailure = "gpu.loom.dev/driver-upgrade-failure"
	// AnnotationFailedTemplate is the driver template hash that failed.
	AnnotationFailedTemplate = "gpu.loom.dev/driver-upgrade-failed-template"

	validationTimeout = 10 * time.Minute
	upgradeRequeue    = 3 * time.Second
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;delete
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create

// UpgradeReconciler rolls a new driver out node by node: cordon, evict the
// GPU pods (eviction API, so disruption budgets hold), replace the node's
// driver pod, wait for it to be ready, uncordon. Progress lives in the
// node label nvidia.com/gpu-driver-upgrade-state, so a manager restart
// resumes where it stopped.
type UpgradeReconciler struct {
	client.Client
	// Reader reads pods straight from the API server: the manager does not
	// cache every pod for a rare upgrade.
	Reader    client.Reader
	Namespace string
	Now       func() time.Time
}

// SetupDriverUpgrade registers the driver upgrade controller.
func SetupDriverUpgrade(_ context.Context, mgr ctrl.Manager, opts manager.Options) error {
	r := &UpgradeReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: opts.Namespace, Now: time.Now}
	driverKey := types.NamespacedName{Namespace: opts.Namespace, Name: objectName(gpuv1alpha1.OperandDriver)}
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
					return e.ObjectOld.GetLabels()[LabelUpgradeState] != e.ObjectNew.GetLabels()[LabelUpgradeState]
				},
				CreateFunc: func(event.CreateEvent) bool { return false },
				DeleteFunc: func(event.DeleteEvent) bool { return false },
			})).
		Complete(r)
}

// Reconcile advances every node's upgrade by at most one step and starts
// new ones within the policy's budget.
func (r *UpgradeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ds := &appsv1.DaemonSet{}
	if err := r.Get(ctx, req.NamespacedName, ds); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	cp, err := r.owner(ctx, ds)
	if err != nil || cp == nil {
		return ctrl.Result{}, err
	}
	policy := cp.Spec.Driver.UpgradePolicy
	want := ds.Spec.Template.Annotations[AnnotationTemplateHash]

	pods := &corev1.PodList{}
	if err := r.Reader.List(ctx, pods, client.InNamespace(r.Namespace),
		client.MatchingLabels{LabelManagedBy: managedBy, LabelComponent: gpuv1alpha1.OperandDriver}); err != nil {
		return ctrl.Result{}, err
	}
	driverPods := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			driverPods[p.Spec.NodeName] = p
		}
	}
	nodes := &metav1.PartialObjectMetadataList{}
	nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := r.List(ctx, nodes, client.MatchingLabels{LabelPresent: "true"}); err != nil {
		return ctrl.Result{}, err
	}
	sort.Slice(nodes.Items, func(i, j int) bool { return nodes.Items[i].Name < nodes.Items[j].Name })

	var inProgress, candidates []string
	failed := 0
	for _, n := range nodes.Items {
		state := n.Labels[LabelUpgradeState]
		pod := driverPods[n.Name]
		outdated := pod != nil && pod.Annotations[AnnotationTemplateHash] != want
		switch state {
		case "", UpgradeDone:
			if outdated && policy.AutoUpgradeEnabled() {
				candidates = append(candidates, n.Name)
			}
		case UpgradeFailed:
			// A failed node waits for a new driver version (or a person).
			// It stays cordoned, so it counts against maxUnavailable.
			failed++
			switch {
			case outdated && policy.AutoUpgradeEnabled() && n.Annotations[AnnotationFailedTemplate] != want:
				candidates = append(candidates, n.Name)
			case pod != nil && !outdated && podReady(pod):
				// The wanted driver runs and is ready after all (a person
				// replaced it, or a new policy brought it): finish the
				// upgrade, uncordoning unless someone else had cordoned.
				if err := r.setState(ctx, n.Name, UncordonRequired, map[string]any{AnnotationFailure: nil, AnnotationFailedTemplate: nil}); err != nil {
					return ctrl.Result{}, err
				}
				inProgress = append(inProgress, n.Name)
			}
		default:
			inProgress = append(inProgress, n.Name)
		}
	}
	start := UpgradeBudget(policy, len(nodes.Items), len(inProgress), failed)
	if err := validSelectors(policy); err != nil && len(candidates) > 0 {
		// Starting would cordon node after node only to fail each one.
		return ctrl.Result{}, fmt.Errorf("not starting driver upgrades: %w", err)
	}
	if start > len(candidates) {
		start = len(candidates)
	}
	for _, name := range candidates[:start] {
		if err := r.setState(ctx, name, UpgradeRequired, nil); err != nil {
			return ctrl.Result{}, err
		}
		inProgress = append(inProgress, name)
	}
	for _, name := range inProgress {
		if err := r.step(ctx, name, driverPods[name], want, policy); err != nil {
			return ctrl.Result{}, fmt.Errorf("node %s: %w", name, err)
		}
	}
	if len(inProgress) > 0 || len(candidates) > start {
		return ctrl.Result{RequeueAfter: upgradeRequeue}, nil
	}
	return ctrl.Result{}, nil
}

// UpgradeBudget is how many nodes may start upgrading now: maxParallelUpgrades
// (0 = unlimited) minus those in progress, and maxUnavailable (a count, or a
// percentage of the GPU nodes rounded up, at least 1) minus those in progress
// and those failed (they stay cordoned): failures cannot cordon the fleet.
func UpgradeBudget(p gpuv1alpha1.DriverUpgradePolicy, gpuNodes, inProgress, failed int) int {
	budget := gpuNodes - inProgress
	if n := p.Parallel(); n > 0 {
		budget = min(budget, int(n)-inProgress)
	}
	if p.MaxUnavailable != nil {
		u, err := intstr.GetScaledValueFromIntOrPercent(p.MaxUnavailable, gpuNodes, true)
		if err == nil {
			budget = min(budget, max(u, 1)-inProgress-failed)
		}
	}
	return max(budget, 0)
}

// validSelectors checks the policy's pod selectors before any node starts.
func validSelectors(p gpuv1alpha1.DriverUpgradePolicy) error {
	if w := p.WaitForCompletion; w != nil && w.PodSelector != "" {
		if _, err := labels.Parse(w.PodSelector); err != nil {
			return fmt.Errorf("waitForCompletion.podSelector %q: %w", w.PodSelector, err)
		}
	}
	if d := p.Drain; d != nil && d.PodSelector != "" {
		if _, err := labels.Parse(d.PodSelector); err != nil {
			return fmt.Errorf("drain.podSelector %q: %w", d.PodSelector, err)
		}
	}
	return nil
}

func (r *UpgradeReconciler) owner(ctx context.Context, ds *appsv1.DaemonSet) (*gpuv1alpha1.ClusterPolicy, error) {
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

// step moves one node's upgrade on by at most one state.
func (r *UpgradeReconciler) step(ctx context.Context, name string, driverPod *corev1.Pod, want string, p gpuv1alpha1.DriverUpgradePolicy) error {
	node := &corev1.Node{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return client.IgnoreNotFound(err)
	}
	started, _ := time.Parse(time.RFC3339, node.Annotations[AnnotationUpgradeStarted])
	phase, err := time.Parse(time.RFC3339, node.Annotations[AnnotationPhaseStarted])
	if err != nil {
		phase = started
	}
	inPhase := r.Now().Sub(phase)
	fail := func(why string) error {
		return r.setState(ctx, name, UpgradeFailed, map[string]any{AnnotationFailure: why, AnnotationFailedTemplate: want})
	}
	switch node.Labels[LabelUpgradeState] {
	case UpgradeRequired:
		ann := map[string]any{AnnotationUpgradeStarted: r.Now().UTC().Format(time.RFC3339), AnnotationFailure: nil, AnnotationFailedTemplate: nil}
		if node.Spec.Unschedulable && node.Annotations[AnnotationFailedTemplate] == "" {
			ann[AnnotationWasCordoned] = "true"
		} else if !node.Spec.Unschedulable {
			if err := r.patchNode(ctx, name, map[string]any{"spec": map[string]any{"unschedulable": true}}); err != nil {
				return err
			}
		}
		return r.setState(ctx, name, WaitForJobsRequired, ann)
	case WaitForJobsRequired:
		w := p.WaitForCompletion
		if w == nil || w.PodSelector == "" {
			return r.setState(ctx, name, PodDeletionRequired, nil)
		}
		sel, err := labels.Parse(w.PodSelector)
		if err != nil {
			return fail(fmt.Sprintf("waitForCompletion.podSelector %q: %v", w.PodSelector, err))
		}
		running, err := r.podsOn(ctx, name, func(pod *corev1.Pod) bool { return sel.Matches(labels.Set(pod.Labels)) })
		if err != nil {
			return err
		}
		timeout := time.Duration(w.TimeoutSeconds) * time.Second
		if len(running) == 0 || (timeout > 0 && inPhase > timeout) {
			// Past the timeout the pods are evicted with the GPU pods.
			return r.setState(ctx, name, PodDeletionRequired, nil)
		}
	case PodDeletionRequired:
		force, emptyDir := false, false
		if d := p.PodDeletion; d != nil {
			force, emptyDir = d.Force, d.DeleteEmptyDir
		}
		left, blocked, err := r.evict(ctx, name, func(pod *corev1.Pod) bool { return inventory.PodGPUs(&pod.Spec) > 0 }, force, emptyDir)
		if err != nil {
			return err
		}
		if left == 0 {
			return r.setState(ctx, name, DrainRequired, nil)
		}
		if timeout := podDeletionTimeout(p); timeout > 0 && inPhase > timeout {
			return fail(fmt.Sprintf("GPU pods still on the node after podDeletion.timeoutSeconds (%s): %s", timeout, describe(left, blocked)))
		}
	case DrainRequired:
		d := p.Drain
		if d == nil || !d.Enable {
			return r.setState(ctx, name, PodRestartRequired, nil)
		}
		sel := labels.Everything()
		if d.PodSelector != "" {
			if sel, err = labels.Parse(d.PodSelector); err != nil {
				return fail(fmt.Sprintf("drain.podSelector %q: %v", d.PodSelector, err))
			}
		}
		left, blocked, err := r.evict(ctx, name, func(pod *corev1.Pod) bool { return sel.Matches(labels.Set(pod.Labels)) }, d.Force, d.DeleteEmptyDir)
		if err != nil {
			return err
		}
		if left == 0 {
			return r.setState(ctx, name, PodRestartRequired, nil)
		}
		if timeout := time.Duration(d.TimeoutSeconds) * time.Second; timeout > 0 && inPhase > timeout {
			return fail(fmt.Sprintf("drain did not finish within drain.timeoutSeconds (%s): %s", timeout, describe(left, blocked)))
		}
	case PodRestartRequired:
		if driverPod != nil && driverPod.Annotations[AnnotationTemplateHash] != want {
			if err := r.Delete(ctx, driverPod); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		return r.setState(ctx, name, ValidationRequired, nil)
	case ValidationRequired:
		if driverPod != nil && driverPod.Annotations[AnnotationTemplateHash] == want && podReady(driverPod) {
			return r.setState(ctx, name, UncordonRequired, nil)
		}
		if inPhase > validationTimeout {
			return fail(fmt.Sprintf("the new driver pod was not ready within %s", validationTimeout))
		}
	case UncordonRequired:
		if node.Annotations[AnnotationWasCordoned] != "true" {
			if err := r.patchNode(ctx, name, map[string]any{"spec": map[string]any{"unschedulable": false}}); err != nil {
				return err
			}
		}
		return r.setState(ctx, name, UpgradeDone, map[string]any{AnnotationWasCordoned: nil, AnnotationUpgradeStarted: nil, AnnotationPhaseStarted: nil})
	}
	return nil
}

// podsOn lists the pods on node, not finished and not Loom's operands,
// that keep accepts.
func (r *UpgradeReconciler) podsOn(ctx context.Context, node string, keep func(*corev1.Pod) bool) ([]*corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := r.Reader.List(ctx, pods, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", node)}); err != nil {
		return nil, err
	}
	var out []*corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Namespace == r.Namespace && p.Labels[LabelManagedBy] == managedBy {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || !keep(p) {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// evict evicts the pods on node that keep accepts, as kubectl drain does:
// through the eviction API (disruption budgets hold), never DaemonSet or
// mirror pods, pods without a controller only with force, pods with
// emptyDir volumes only with deleteEmptyDir. It returns how many are left
// and which of them it refused to evict, and why.
func (r *UpgradeReconciler) evict(ctx context.Context, node string, keep func(*corev1.Pod) bool, force, deleteEmptyDir bool) (int, []string, error) {
	pods, err := r.podsOn(ctx, node, func(p *corev1.Pod) bool {
		if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			return false
		}
		if c := metav1.GetControllerOf(p); c != nil && c.Kind == "DaemonSet" {
			return false
		}
		return keep(p)
	})
	if err != nil {
		return 0, nil, err
	}
	var blocked []string
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		if !force && metav1.GetControllerOf(p) == nil {
			blocked = append(blocked, p.Namespace+"/"+p.Name+" has no controller (force evicts it)")
			continue
		}
		if !deleteEmptyDir && hasEmptyDir(p) {
			blocked = append(blocked, p.Namespace+"/"+p.Name+" has emptyDir data (deleteEmptyDir evicts it)")
			continue
		}
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
		if err := r.SubResource("eviction").Create(ctx, p, ev); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsTooManyRequests(err) {
			return 0, nil, fmt.Errorf("evicting %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return len(pods), blocked, nil
}

func hasEmptyDir(p *corev1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if v.EmptyDir != nil {
			return true
		}
	}
	return false
}

func describe(left int, blocked []string) string {
	msg := fmt.Sprintf("%d pods left", left)
	if len(blocked) > 0 {
		msg += "; not evicted: " + strings.Join(blocked, ", ")
	} else {
		msg += " (evictions refused, e.g. by a PodDisruptionBudget)"
	}
	return msg
}

func podDeletionTimeout(p gpuv1alpha1.DriverUpgradePolicy) time.Duration {
	if p.PodDeletion != nil {
		return time.Duration(p.PodDeletion.TimeoutSeconds) * time.Second
	}
	return 300 * time.Second
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// setState moves a node to state, with annotations to set (nil value
// removes one), in one merge patch.
func (r *UpgradeReconciler) setState(ctx context.Context, node, state string, annotations map[string]any) error {
	meta := map[string]any{"labels": map[string]any{LabelUpgradeState: state}}
	ann := map[string]any{AnnotationPhaseStarted: r.Now().UTC().Format(time.RFC3339)}
	for k, v := range annotations {
		ann[k] = v
	}
	meta["annotations"] = ann
	return r.patchNode(ctx, node, map[string]any{"metadata": meta})
}

// patchNode merge-patches a node: spec.unschedulable and the upgrade label
// are shared with people and other tools, so Loom does not take server-side
// apply ownership of them.
func (r *UpgradeReconciler) patchNode(ctx context.Context, name string, patch map[string]any) error {
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	n := &corev1.Node{}
	n.Name = name
	return r.Patch(ctx, n, client.RawPatch(types.MergePatchType, b))
}
