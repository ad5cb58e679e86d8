package training

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
)

// syncWorkload is the write side of the Kueue contract, after the pods: the
// job's Workload is created (and replaced while it holds no quota if the
// job's pod sets, its LocalQueue or its maximum execution time changed;
// its priority follows the job's kueue.x-k8s.io/priority-class label), an evicted Workload's quota is
// released once the gang is gone, the Workload of an ended job is marked
// Finished, that of a job whose queue label was removed is deleted, and
// the admitted Workload's PodsReady follows the gang.
func (r *Reconciler) syncWorkload(ctx context.Context, job *trainingv1alpha1.TrainingJob, obs observed, d *decision) error {
	k := obs.kueue
	if !k.served {
		return nil
	}
	wl := k.wl
	now := obs.now
	remove := func(why string) error { return r.removeWorkload(ctx, wl, why) }
	if wl != nil && slices.Contains(wl.Finalizers, kueue.ResourceInUseFinalizer) &&
		(wl.Finished() || wl.DeletionTimestamp != nil && (!k.queued || len(ownPods(job, obs.pods)) == 0)) {
		// As jobframework: a finished Workload, or a deleted one whose
		// gang is gone (or runs outside Kueue now), keeps no quota.
		return r.dropFinalizer(ctx, wl, "the Workload is finished, or deleted and the gang is gone: its quota is released")
	}
	switch {
	case !k.queued:
		// A finished Workload is Kueue's record of the job: it stays.
		if wl == nil || wl.GetDeletionTimestamp() != nil || wl.Finished() {
			return nil
		}
		return remove("the job's " + kueue.QueueLabel + " label was removed: it no longer waits for Kueue")
	case k.deleting():
		return nil // its deletion wakes the job, whose next Workload is then created
	case wl == nil && (k.missingClass != "" || k.cannotRun != "" || k.badQueue != ""):
		return nil // held until the class exists (kueueHold says so), or the job is mended (limit, invalid, its queue label)
	case wl == nil && !d.status.Finished():
		return r.writer.Ensure(ctx, job, desiredWorkload(job, k.priority, r.kueue.labelKeys))
	case wl == nil || wl.Finished():
		return nil
	case d.status.Finished():
		msg := "the TrainingJob " + string(d.status.State)
		return r.patchWorkloadStatus(ctx, wl, kueue.FinishStatus(wl, d.status.State == trainingv1alpha1.StateSucceeded, msg, now), "the job ended")
	case k.cannotRun != "" && len(ownPods(job, obs.pods)) == 0:
		// Admitted or not, it would hold quota (or queue) for a gang
		// that never starts; a new one is made once the job is mended.
		return remove("the job cannot run as written (" + k.cannotRun + "): its Workload goes, and its quota with it, until the job is mended")
	case wl.Evicted() != nil && wl.QuotaReserved() && len(ownPods(job, obs.pods)) == 0:
		return r.patchWorkloadStatus(ctx, wl, kueue.ReleaseStatus(wl, "", now), "evicted and the gang is gone: release the quota")
	case k.stale && wl.QuotaReserved() && len(ownPods(job, obs.pods)) == 0:
		// As jobframework with a job no longer equivalent to its
		// Workload: the gang stopped, the admission goes, and the
		// Workload is replaced (below, once it holds no quota).
		why := "the job's pod sets changed since the admission"
		if u := wl.Uncovered(); u != "" {
			why = "the admission covered part of the gang (" + u + "), and a gang runs whole"
		}
		return r.patchWorkloadStatus(ctx, wl, kueue.ReleaseStatus(wl, why, now), why+", and the gang is gone: release the quota")
	case !wl.QuotaReserved() && !wl.SamePodSets(podSets(job)):
		return remove("the job's pod sets changed")
	case !wl.QuotaReserved() && wl.Spec.QueueName != job.Labels[kueue.QueueLabel]:
		return remove("the job moved to LocalQueue " + job.Labels[kueue.QueueLabel])
	case !wl.QuotaReserved() && !equalPtr(wl.Spec.MaximumExecutionTimeSeconds, kueue.MaxExecTime(job.Labels)):
		// As jobframework, for which such a Workload is not equivalent
		// to its job; one holding quota keeps the time it was admitted
		// with (Kueue's webhook refuses the edit on a running job).
		return remove("the job's " + kueue.MaxExecTimeLabel + " label changed")
	case job.Spec.RunPolicy.Suspend && wl.Active(), !job.Spec.RunPolicy.Suspend && k.suspendedByLoom():
		patch, why := activation(job.Spec.RunPolicy.Suspend)
		return r.patchWorkload(ctx, wl, patch, false, why)
	case priorityRelabelled(wl, k.priority):
		// As jobframework: the kueue.x-k8s.io/priority-class label is
		// mutable, and a Workload without a priority or with a
		// WorkloadPriorityClass's follows it, admitted or not (a raised
		// priority protects a running job from preemption).
		patch := map[string]any{"spec": map[string]any{"priorityClassRef": k.priority.ref, "priority": k.priority.value}}
		return r.patchWorkload(ctx, wl, patch, false, "the job's "+kueue.PriorityClassLabel+" label changed")
	case wl.Evicted() == nil && !k.stale:
		// Kueue's waitForPodsReady evicts an admitted Workload whose
		// PodsReady is not True in time: the job controller says when
		// its gang is ready (every pod runs), as jobframework does.
		if patch := kueue.PodsReadyStatus(wl, condTrue(&d.status, trainingv1alpha1.ConditionReady), now); patch != nil {
			return r.patchWorkloadStatus(ctx, wl, patch, "the gang's readiness changed (Kueue's PodsReady)")
		}
	}
	return nil
}

// removeWorkload deletes wl (that object: its UID) for why.
func (r *Reconciler) removeWorkload(ctx context.Context, wl *kueue.Workload, why string) error {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kueue.WorkloadGVK)
	u.SetNamespace(wl.Namespace)
	u.SetName(wl.Name)
	u.SetUID(wl.UID)
	return r.writer.Delete(ctx, u, why)
}

// dropFinalizer removes Loom's kueue.x-k8s.io/resource-in-use finalizer
// from the Workload, guarded by the resourceVersion read.
func (r *Reconciler) dropFinalizer(ctx context.Context, wl *kueue.Workload, why string) error {
	rest := slices.DeleteFunc(slices.Clone(wl.Finalizers), func(f string) bool { return f == kueue.ResourceInUseFinalizer })
	return r.patchWorkload(ctx, wl, map[string]any{"metadata": map[string]any{"finalizers": rest}}, false, why)
}

// activation is the Workload patch that follows a person suspending a
// queued job (runPolicy.suspend), and resuming it. Deactivating the
// Workload is Kueue's answer to a person stopping a queued job: Kueue
// evicts it, and its quota is released once the gang is gone, instead of
// held until Kueue evicts the stopped gang for another reason. The
// annotation says Loom deactivated it, so that resuming reactivates only
// a Workload Loom deactivated, never one a person or Kueue did.
func activation(suspend bool) (patch map[string]any, why string) {
	if suspend {
		return map[string]any{"spec": map[string]any{"active": false},
				"metadata": map[string]any{"annotations": map[string]any{trainingv1alpha1.AnnotationWorkloadSuspended: "true"}}},
			"the job is suspended (runPolicy.suspend): deactivate its Workload to release its quota"
	}
	return map[string]any{"spec": map[string]any{"active": true},
			"metadata": map[string]any{"annotations": map[string]any{trainingv1alpha1.AnnotationWorkloadSuspended: nil}}},
		"the job resumed: reactivate the Workload Loom deactivated for its suspension"
}

// readPriority: the priority is read (live, around the cache) for a new
// Workload, and for one whose WorkloadPriorityClass the job's label no
// longer names.
func readPriority(wl *kueue.Workload, job *trainingv1alpha1.TrainingJob) bool {
	if wl == nil {
		return true
	}
	name := job.Labels[kueue.PriorityClassLabel]
	return name != "" && !wl.Finished() &&
		priorityRelabelled(wl, &kueuePriority{ref: kueue.PriorityClassRef{Kind: kueue.WorkloadPriorityClassGVK.Kind, Name: name}})
}

// priorityRelabelled: the job names a WorkloadPriorityClass other than
// its Workload's, and the Workload has no priority or a
// WorkloadPriorityClass's (one from a pod PriorityClass stays).
func priorityRelabelled(wl *kueue.Workload, p *kueuePriority) bool {
	if p == nil || p.ref.Kind != kueue.WorkloadPriorityClassGVK.Kind {
		return false
	}
	cur := wl.Spec.PriorityClassRef
	return cur == nil || (cur.Kind == kueue.WorkloadPriorityClassGVK.Kind && cur.Name != p.ref.Name)
}

func equalPtr(a, b *int32) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// patchWorkloadStatus merge-patches the Workload's status subresource,
// guarded by the resourceVersion read: Kueue writes the same conditions,
// and a patch from a stale copy must fail (the next pass retries) rather
// than undo Kueue's newer word.
func (r *Reconciler) patchWorkloadStatus(ctx context.Context, wl *kueue.Workload, patch map[string]any, why string) error {
	return r.patchWorkload(ctx, wl, patch, true, why)
}

// patchWorkload merge-patches the Workload (its status subresource when
// status is set), guarded by the resourceVersion read.
func (r *Reconciler) patchWorkload(ctx context.Context, wl *kueue.Workload, patch map[string]any, status bool, why string) error {
	m, _ := patch["metadata"].(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	m["resourceVersion"] = wl.ResourceVersion
	patch["metadata"] = m
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kueue.WorkloadGVK)
	u.SetNamespace(wl.Namespace)
	u.SetName(wl.Name)
	log.FromContext(ctx).V(1).Info("patch", "kind", "Workload", "object", client.ObjectKeyFromObject(u), "fieldOwner", FieldOwner, "why", why)
	p := client.RawPatch(types.MergePatchType, b)
	if !status {
		if err := r.Patch(ctx, u, p, client.FieldOwner(FieldOwner)); err != nil {
			return fmt.Errorf("patching Workload %s/%s: %w", wl.Namespace, wl.Name, err)
		}
		return nil
	}
	if err := r.Status().Patch(ctx, u, p, client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("patching the status of Workload %s/%s: %w", wl.Namespace, wl.Name, err)
	}
	return nil
}
