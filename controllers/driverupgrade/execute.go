package driverupgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
)

// maxBlocked caps the refused evictions a blocked annotation records.
const maxBlocked = 1024

// execute carries out next's actions: evictions and the driver pod delete
// in order, then the node's own changes (cordon, state, annotations, and
// the evictions the API server refused) in one merge patch, conditional
// on the resourceVersion the node was read at: a node changed since (a
// conflict) is stepped again next pass from what it is then.
// spec.unschedulable and the upgrade label are shared with people and
// other tools, so Loom does not take server-side apply ownership of them.
func (r *Reconciler) execute(ctx context.Context, node *corev1.Node, actions []action) error {
	spec, meta := map[string]any{}, map[string]any{}
	annotations := map[string]any{}
	why, stateChanged, evicted := "node state", false, false
	var refused []string
	for _, a := range actions {
		switch a.kind {
		case cordon, uncordon:
			spec["unschedulable"] = a.kind == cordon
		case setState:
			why, stateChanged = "to "+a.state, true
			var v any = a.state
			if a.state == "" {
				v = nil
			}
			meta["labels"] = map[string]any{gpuv1alpha1.LabelUpgradeState: v}
			for k, v := range a.annotations {
				annotations[k] = v
			}
		case evict:
			evicted = true
			refused = append(refused, r.evict(ctx, a.pods)...)
		case deleteDriver:
			for _, p := range a.pods {
				if err := r.w.Delete(ctx, p, "its driver template is outdated"); err != nil {
					return err
				}
			}
		}
	}
	_, wasBlocked := node.Annotations[gpuv1alpha1.AnnotationBlocked]
	switch {
	case len(refused) > 0 && !stateChanged:
		why = "eviction refused"
		annotations[gpuv1alpha1.AnnotationBlocked] = apply.Truncate(strings.Join(refused, "; "), maxBlocked)
	case evicted && len(refused) == 0 && wasBlocked && !stateChanged:
		annotations[gpuv1alpha1.AnnotationBlocked] = nil
	}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}
	return r.patchNode(ctx, node, spec, meta, why)
}

// patchNode sends spec and meta as one merge patch guarded by the node's
// resourceVersion; nothing when both are empty.
func (r *Reconciler) patchNode(ctx context.Context, node *corev1.Node, spec, meta map[string]any, why string) error {
	if len(spec) == 0 && len(meta) == 0 {
		return nil
	}
	meta["resourceVersion"] = node.ResourceVersion
	patch := map[string]any{"metadata": meta}
	if len(spec) > 0 {
		patch["spec"] = spec
	}
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}
	err = r.w.Patch(ctx, n, client.RawPatch(types.MergePatchType, b), "driver upgrade: "+why)
	if apierrors.IsConflict(err) {
		return apierrors.NewConflict(corev1.Resource("nodes"), node.Name, err)
	}
	return err
}

// evict evicts pods through the eviction API. A pod already gone, or one
// a disruption budget holds (429), is not refused: the next pass sees it.
// Any other answer is returned, naming the pod; the other pods are still
// evicted.
func (r *Reconciler) evict(ctx context.Context, pods []*corev1.Pod) []string {
	var refused []string
	for _, p := range pods {
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
		if err := r.SubResource("eviction").Create(ctx, p, ev); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsTooManyRequests(err) {
			refused = append(refused, fmt.Sprintf("evicting %s/%s: %v", p.Namespace, p.Name, err))
		}
	}
	return refused
}

// acknowledge carries out a resume: it marks the failed nodes plan named
// as acknowledged, then removes the resume annotation from the policy
// (a crash between the two acknowledges them again, which is the same).
func (r *Reconciler) acknowledge(ctx context.Context, cp *gpuv1alpha1.ClusterPolicy, pl planned) []error {
	if !pl.resumed {
		return nil
	}
	var errs []error
	for _, name := range pl.acknowledge {
		b := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"true"}}}`, gpuv1alpha1.AnnotationFailureAcknowledged)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := r.w.Patch(ctx, n, client.RawPatch(types.MergePatchType, b), "driver upgrade: resume past the failure"); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errs
	}
	b := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null}}}`, gpuv1alpha1.AnnotationResume)
	p := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: cp.Name}}
	if err := r.w.Patch(ctx, p, client.RawPatch(types.MergePatchType, b), "driver upgrade resumed"); err != nil {
		return []error{err}
	}
	return nil
}

// status writes the policy's DriverUpgrade condition. A policy that runs
// no driver DaemonSet and claims no node (one not in force) gets none.
func (r *Reconciler) status(ctx context.Context, obs observed, pl planned) error {
	var st metav1.ConditionStatus
	var reason, msg string
	claimed := len(claimedBy(obs.nodes, obs.cp.Name))
	switch {
	case obs.release && claimed > 0:
		st, reason, msg = metav1.ConditionFalse, gpuv1alpha1.ReasonUpgradeInProgress,
			fmt.Sprintf("the driver operand is disabled: releasing %d nodes the driver upgrade claimed", claimed)
	case obs.release:
		st, reason, msg = metav1.ConditionTrue, gpuv1alpha1.ReasonDriverDisabled, "the driver operand is disabled: no driver upgrades"
	case obs.daemonSets == 0 && claimed == 0 && len(currentStatus(obs.cp).Conditions) == 0:
		// Nothing said yet, and nothing to say: the stack's first pass has
		// not made a driver DaemonSet. Once said, the condition follows the
		// nodes (a GPU pool scaled to zero mid-upgrade is no longer in
		// progress).
		return nil
	default:
		st, reason, msg = condition(pl.summary, pl.invalid)
	}
	_, err := r.w.Status(ctx, obs.cp, currentStatus(obs.cp), desiredStatus(obs.cp, st, reason, msg, r.Now()))
	return err
}
