// Package uninstall removes what Loom put on a cluster outside its Helm
// release: the chart's pre-delete hook (`loom uninstall-cleanup`) and
// `kubectl loom uninstall-cleanup` run the same code.
package uninstall

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	rayutils "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/kueue"
)

// Config is what Run removes, and how long it waits for each step.
type Config struct {
	Namespace         string // Loom's namespace
	ManagerDeployment string // the chart's manager Deployment ("": none to stop)
	AgentDaemonSet    string // the chart's node agent DaemonSet ("": none to stop)
	Lease             string // the manager's leader-election Lease
	RayJobs           bool   // Loom's rayjob controller ran: its stop-job finalizers go
	Workloads         bool   // Loom's trainingjob controller ran: its Workloads' resource-in-use finalizers go
	Timeout           time.Duration
	Poll              time.Duration
	out               io.Writer // progress lines
}

// Run removes what Loom put on the cluster outside its Helm release, in
// this order:
//
//  1. every ClusterPolicy, then it waits until the garbage collector has
//     removed the operands (DaemonSets, RuntimeClass) and the running
//     manager's driver-upgrade controller has released (uncordoned) every
//     node it claimed (not for the nodes when no manager leads);
//  2. the manager Deployment and the node agent DaemonSet, waiting until
//     the leader Lease is free and their pods are gone (but for pods
//     deleted on a node that is not Ready: writerPods), so that
//     nothing writes GPUNodes or labels again; then it releases the nodes
//     still claimed itself (releaseNodes);
//  3. every GPUNode, and on every Node the labels the GPU labeller set
//     (field manager loom-gpu-labels), its unhealthy taint and the
//     ClusterPolicy's gpu.loom.dev/driver-target and the
//     nvidia.com/gpu.deploy.<operand>=true labels it set (unlabelPolicy);
//     labels anyone else set or changed stay;
//  4. with cfg.RayJobs, KubeRay's stop-job finalizer on every RayJob: with
//     no manager left to remove it, deleting a RayJob (or its namespace)
//     would hang for ever. A RayJob deleted later takes its cluster, and so
//     its Ray job, with it (owner reference);
//  5. with cfg.Workloads, Kueue's resource-in-use finalizer on the
//     Workloads of TrainingJobs (removeWorkloadFinalizers).
//
// It goes on past what it cannot do, except a manager still leading after
// step 2, and returns every error.
func Run(ctx context.Context, c client.Client, cfg Config, out io.Writer) error {
	cfg.out = out
	policies, err := deletePolicies(ctx, c, out)
	if err != nil {
		return err
	}
	var errs []error
	claims := policies
	if holder, err := leaseHolder(ctx, c, cfg.Namespace, cfg.Lease); err != nil {
		return err
	} else if holder == "" {
		// No manager leads (uninstalled already): none releases the
		// claimed nodes; they are released below without a wait.
		claims = nil
	}
	if err := waitFor(ctx, cfg, "operands removed and claimed nodes released", func(ctx context.Context) (string, error) {
		return pendingRelease(ctx, c, cfg.Namespace, claims)
	}); err != nil {
		// The manager is not running, or its driver upgrade is not:
		// the nodes it claimed are released below, once it is stopped.
		fmt.Fprintf(out, "%v; going on\n", err)
	}
	if err := stopWriters(ctx, c, cfg, out); err != nil {
		// A manager still running may write what is removed next.
		return err
	}
	errs = append(errs, releaseNodes(ctx, c, out))
	if left, err := pendingRelease(ctx, c, cfg.Namespace, nil); err != nil {
		errs = append(errs, err)
	} else if left != "" {
		errs = append(errs, fmt.Errorf("not removed (see their events and finalizers): %s", left))
	}
	errs = append(errs, removeNodeState(ctx, c, out))
	if cfg.RayJobs {
		errs = append(errs, removeRayJobFinalizers(ctx, c, out))
	}
	if cfg.Workloads {
		errs = append(errs, removeWorkloadFinalizers(ctx, c, out))
	}
	return errors.Join(errs...)
}

// releaseNodes does for every node a driver upgrade still claims what the
// manager's release would have (its policy is gone, the manager stopped):
// it lifts the cordon if it is Loom's (gpuv1alpha1.LoomCordoned), and
// removes the upgrade's state label and annotations. A cordon that is not
// Loom's stays, and the node is named. It goes on past a node it cannot
// patch, and returns every such error.
func releaseNodes(ctx context.Context, c client.Client, out io.Writer) error {
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	var errs []error
	for i := range nodes.Items {
		n := &nodes.Items[i]
		claim, claimed := n.Annotations[gpuv1alpha1.AnnotationClaim]
		if !claimed {
			continue
		}
		base := n.DeepCopy()
		uncordon := gpuv1alpha1.LoomCordoned(n, claim)
		if uncordon {
			n.Spec.Unschedulable = false
		}
		for k := range n.Annotations {
			if strings.HasPrefix(k, "gpu.loom.dev/driver-upgrade-") {
				delete(n.Annotations, k)
			}
		}
		if gpuv1alpha1.KnownUpgradeState(n.Labels[gpuv1alpha1.LabelUpgradeState]) {
			delete(n.Labels, gpuv1alpha1.LabelUpgradeState)
		}
		err := c.Patch(ctx, n, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}), client.FieldOwner(gpuv1alpha1.FieldOwnerDriverUpgrade))
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			errs = append(errs, fmt.Errorf("releasing node %s from the driver upgrade (kubectl uncordon it if Loom cordoned it, and remove its %s* annotations): %w",
				n.Name, "gpu.loom.dev/driver-upgrade-", err))
		case uncordon:
			fmt.Fprintf(out, "released node %s from the driver upgrade and uncordoned it\n", n.Name)
		case n.Spec.Unschedulable:
			fmt.Fprintf(out, "released node %s from the driver upgrade; it stays cordoned, as it was before its upgrade or cordoned since by someone else "+
				"(kubectl uncordon %s if it should not be)\n", n.Name, n.Name)
		default:
			fmt.Fprintf(out, "released node %s from the driver upgrade\n", n.Name)
		}
	}
	return errors.Join(errs...)
}

// removeRayJobFinalizers takes KubeRay's stop-job finalizer (which Loom's
// rayjob controller adds) off every RayJob; other finalizers stay. No
// RayJob CRD is nothing to do.
func removeRayJobFinalizers(ctx context.Context, c client.Client, out io.Writer) error {
	return removeFinalizers(ctx, c, out, &rayv1.RayJobList{}, "RayJob", rayutils.RayJobStopJobFinalizer, "stop-job",
		func(client.Object) bool { return true })
}

// removeWorkloadFinalizers takes Kueue's resource-in-use finalizer, which
// Loom's trainingjob controller puts on the Workloads of its TrainingJobs,
// off each of them; Kueue removes it only from Workloads no one owns, so
// with no manager left a TrainingJob's deleted Workload (and its
// namespace) would hang. Workloads of other owners keep theirs. No
// Workload CRD (no Kueue) is nothing to do.
func removeWorkloadFinalizers(ctx context.Context, c client.Client, out io.Writer) error {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(kueue.WorkloadGVK.GroupVersion().WithKind(kueue.WorkloadGVK.Kind + "List"))
	return removeFinalizers(ctx, c, out, list, "Workload", kueue.ResourceInUseFinalizer, kueue.ResourceInUseFinalizer, ownedByATrainingJob)
}

// removeFinalizers lists list's kind and takes finalizer (what, in the
// output) off each item that has it and that loom says is Loom's to free;
// other finalizers and items stay. A kind not served is nothing to do.
func removeFinalizers(ctx context.Context, c client.Client, out io.Writer, list client.ObjectList, kind, finalizer, what string, loom func(client.Object) bool) error {
	if err := c.List(ctx, list); meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("listing %ss: %w", kind, err)
	}
	var errs []error
	err := meta.EachListItem(list, func(item runtime.Object) error {
		o, ok := item.(client.Object)
		if !ok || !controllerutil.ContainsFinalizer(o, finalizer) || !loom(o) {
			return nil
		}
		patch := client.MergeFromWithOptions(o.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
		controllerutil.RemoveFinalizer(o, finalizer)
		if err := c.Patch(ctx, o, patch); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("removing the %s finalizer of %s %s/%s: %w", what, kind, o.GetNamespace(), o.GetName(), err))
			return nil
		}
		fmt.Fprintf(out, "removed the %s finalizer of %s %s/%s\n", what, kind, o.GetNamespace(), o.GetName())
		return nil
	})
	return errors.Join(append(errs, err)...)
}

// ownedByATrainingJob: o's controller is one of Loom's TrainingJobs.
func ownedByATrainingJob(o client.Object) bool {
	ref := metav1.GetControllerOf(o)
	return ref != nil && ref.Kind == "TrainingJob" && strings.HasPrefix(ref.APIVersion, trainingv1alpha1.GroupVersion.Group+"/")
}

// deletePolicies deletes every ClusterPolicy; without the CRD (deleted
// before the uninstall) there is none.
func deletePolicies(ctx context.Context, c client.Client, out io.Writer) ([]string, error) {
	list := &gpuv1alpha1.ClusterPolicyList{}
	if err := c.List(ctx, list); meta.IsNoMatchError(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("listing ClusterPolicies: %w", err)
	}
	var names []string
	for i := range list.Items {
		cp := &list.Items[i]
		if err := c.Delete(ctx, cp); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("deleting ClusterPolicy %s: %w", cp.Name, err)
		}
		fmt.Fprintf(out, "deleted ClusterPolicy %s\n", cp.Name)
		names = append(names, cp.Name)
	}
	return names, nil
}

// pendingRelease says what is left of the deleted policies: the policies
// themselves, their operand DaemonSets, and nodes still claimed by a
// driver upgrade. "" means nothing.
func pendingRelease(ctx context.Context, c client.Client, namespace string, policies []string) (string, error) {
	var left []string
	cps := &gpuv1alpha1.ClusterPolicyList{}
	if err := c.List(ctx, cps); err != nil && !meta.IsNoMatchError(err) {
		return "", err
	}
	for _, cp := range cps.Items {
		left = append(left, "ClusterPolicy "+cp.Name)
	}
	dss := &appsv1.DaemonSetList{}
	if err := c.List(ctx, dss, client.InNamespace(namespace), client.MatchingLabels{apply.LabelManagedBy: apply.ManagedBy}); err != nil {
		return "", err
	}
	for _, ds := range dss.Items {
		left = append(left, "DaemonSet "+ds.Name)
	}
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return "", err
	}
	for _, n := range nodes.Items {
		if claim := n.Annotations[gpuv1alpha1.AnnotationClaim]; claim != "" && slices.Contains(policies, claim) {
			left = append(left, "node "+n.Name+" (claimed by the driver upgrade)")
		}
	}
	return strings.Join(left, ", "), nil
}

// stopWriters deletes the manager Deployment and the node agent DaemonSet
// and waits until the manager no longer leads and their pods are gone: a
// manager run without leader election holds no Lease, and its pods are
// the only sign that it still writes.
func stopWriters(ctx context.Context, c client.Client, cfg Config, out io.Writer) error {
	var managerPods labels.Selector
	var agentUID types.UID
	kinds := []string{"Deployment", "DaemonSet"}
	for i, obj := range []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.ManagerDeployment}},
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.AgentDaemonSet}},
	} {
		if obj.GetName() == "" {
			continue
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return err
		}
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			agentUID = o.UID
		case *appsv1.Deployment:
			// A selector that selects nothing (or everything) tells no pod.
			if sel, err := metav1.LabelSelectorAsSelector(o.Spec.Selector); err == nil && !sel.Empty() {
				managerPods = sel
			}
		}
		if err := c.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting %s: %w", obj.GetName(), err)
		}
		fmt.Fprintf(out, "deleted %s %s/%s\n", kinds[i], cfg.Namespace, obj.GetName())
	}
	var stranded []string
	err := waitFor(ctx, cfg, "the manager and the node agents stopped", func(ctx context.Context) (string, error) {
		var left []string
		if holder, err := leaseHolder(ctx, c, cfg.Namespace, cfg.Lease); err != nil {
			return "", err
		} else if holder != "" {
			left = append(left, "the manager "+holder+" still leads")
		}
		if agentUID == "" && managerPods == nil {
			return strings.Join(left, ", "), nil
		}
		pods, err := writerPods(ctx, c, cfg.Namespace, agentUID, managerPods)
		stranded = pods.stranded
		return strings.Join(append(left, pods.left...), ", "), err
	})
	if err == nil && len(stranded) > 0 {
		fmt.Fprintf(out, "not waited for %s: deleted on a node that is not Ready, so no kubelet stops it there; "+
			"it stops when the node is back (or deleted)\n", strings.Join(stranded, ", "))
	}
	return err
}

// podsLeft are the writers' pods still there: left to wait for, and
// stranded, deleted on a node that is not Ready or is gone, whose kubelet
// cannot stop them (one dead node would otherwise hold the uninstall for
// ever).
type podsLeft struct{ left, stranded []string }

// writerPods are the node agent's pods (controlled by agentUID) and the
// manager's (selected by managerPods) in namespace.
func writerPods(ctx context.Context, c client.Client, namespace string, agentUID types.UID, managerPods labels.Selector) (podsLeft, error) {
	var out podsLeft
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(namespace)); err != nil {
		return out, err
	}
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return out, err
	}
	up := map[string]bool{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		ready := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady })
		// A node that has not said whether it is Ready is not known down.
		up[n.Name] = ready < 0 || n.Status.Conditions[ready].Status == corev1.ConditionTrue
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		var what string
		switch {
		case agentUID != "" && metav1.IsControlledBy(p, &metav1.ObjectMeta{UID: agentUID}):
			what = "node agent pod " + p.Name
		case managerPods != nil && managerPods.Matches(labels.Set(p.Labels)):
			what = "manager pod " + p.Name
		default:
			continue
		}
		if p.DeletionTimestamp != nil && p.Spec.NodeName != "" && !up[p.Spec.NodeName] {
			out.stranded = append(out.stranded, what+" on node "+p.Spec.NodeName)
			continue
		}
		out.left = append(out.left, what)
	}
	return out, nil
}

// leaseHolder is who holds the Lease now: "" when no one does or the
// holder stopped renewing it.
func leaseHolder(ctx context.Context, c client.Client, namespace, name string) (string, error) {
	l := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, l); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if holder == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return holder, nil
	}
	if time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
		return "", nil
	}
	return holder, nil
}

// removeNodeState deletes every GPUNode (none without the CRD) and takes
// the labeller's labels, annotation and taint off every Node.
func removeNodeState(ctx context.Context, c client.Client, out io.Writer) error {
	gns := &gpuv1alpha1.GPUNodeList{}
	if err := c.List(ctx, gns); err != nil && !meta.IsNoMatchError(err) {
		return fmt.Errorf("listing GPUNodes: %w", err)
	}
	for i := range gns.Items {
		if err := c.Delete(ctx, &gns.Items[i]); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting GPUNode %s: %w", gns.Items[i].Name, err)
		}
	}
	fmt.Fprintf(out, "deleted %d GPUNodes\n", len(gns.Items))
	// The ClusterPolicy's RuntimeClass, when Loom's (not the toolkit's).
	rc := &nodev1.RuntimeClass{}
	if err := c.Get(ctx, client.ObjectKey{Name: "nvidia"}, rc); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("reading RuntimeClass nvidia: %w", err)
	} else if err == nil && rc.Labels[apply.LabelManagedBy] == apply.ManagedBy {
		if err := c.Delete(ctx, rc, client.Preconditions{UID: &rc.UID}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting RuntimeClass nvidia: %w", err)
		}
		fmt.Fprintln(out, "deleted RuntimeClass nvidia")
	}
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	var errs []error
	for i := range nodes.Items {
		errs = append(errs, unlabelNode(ctx, c, &nodes.Items[i], out))
	}
	return errors.Join(errs...)
}

// unlabelNode applies an empty Node as the labeller's field manager, which
// removes exactly the fields that manager owns (its labels and its
// managed-labels annotation), then lifts the unhealthy taint if the
// labeller set it.
func unlabelNode(ctx context.Context, c client.Client, n *corev1.Node, out io.Writer) error {
	if slices.ContainsFunc(n.ManagedFields, func(m metav1.ManagedFieldsEntry) bool { return m.Manager == gpuv1alpha1.FieldOwnerGPULabels }) {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind("Node")
		u.SetName(n.Name)
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(gpuv1alpha1.FieldOwnerGPULabels), client.ForceOwnership); err != nil {
			return fmt.Errorf("removing Loom's labels from node %s: %w", n.Name, err)
		}
		fmt.Fprintf(out, "removed Loom's labels from node %s\n", n.Name)
	}
	if err := unlabelPolicy(ctx, c, n, out); err != nil {
		return err
	}
	if _, tainted := n.Annotations[gpuv1alpha1.AnnotationUnhealthyTaint]; !tainted {
		return nil
	}
	fresh := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: n.Name}, fresh); err != nil {
		return client.IgnoreNotFound(err)
	}
	base := fresh.DeepCopy()
	fresh.Spec.Taints = slices.DeleteFunc(fresh.Spec.Taints, gpuv1alpha1.IsUnhealthyTaint)
	delete(fresh.Annotations, gpuv1alpha1.AnnotationUnhealthyTaint)
	if err := c.Patch(ctx, fresh, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("removing Loom's taint from node %s: %w", n.Name, err)
	}
	fmt.Fprintf(out, "removed Loom's taint from node %s\n", n.Name)
	return nil
}

// unlabelPolicy removes the ClusterPolicy's labels from n: its placement
// label (Loom's key alone), and the nvidia.com/gpu.deploy.<operand>=true
// labels it set where they were missing, those its field manager owns and
// still true; a value anyone else set or changed (false, paused) stays.
func unlabelPolicy(ctx context.Context, c client.Client, n *corev1.Node, out io.Writer) error {
	gone := map[string]any{}
	for k, v := range n.Labels {
		switch {
		case k == gpuv1alpha1.LabelDriverTarget:
			gone[k] = nil
		case strings.HasPrefix(k, gpuv1alpha1.DeployLabelPrefix) && v == "true" &&
			gpuv1alpha1.ManagesLabel(n.ManagedFields, gpuv1alpha1.FieldOwnerClusterPolicy, k):
			gone[k] = nil
		}
	}
	if len(gone) == 0 {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": gone}}) // plain data
	if err := c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("removing the ClusterPolicy's labels from node %s: %w", n.Name, err)
	}
	fmt.Fprintf(out, "removed the ClusterPolicy's labels from node %s\n", n.Name)
	return nil
}

// waitFor polls pending until it reports nothing left, printing what is
// left when it changes.
func waitFor(ctx context.Context, cfg Config, what string, pending func(context.Context) (string, error)) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, cfg.Poll, cfg.Timeout, true, func(ctx context.Context) (bool, error) {
		left, err := pending(ctx)
		if err != nil {
			return false, err
		}
		if left != "" && left != last {
			fmt.Fprintf(cfg.out, "waiting for %s: %s\n", what, left)
		}
		last = left
		return left == "", nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s (left: %s): %w", what, last, err)
	}
	return nil
}
