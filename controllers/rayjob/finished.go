package rayjob

import (
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"k8s.io/utils/ptr"
)

// finished applies the clean-up a finished RayJob asks for: its
// deletionStrategy (rules, or the legacy onSuccess/onFailure pair), else
// shutdownAfterJobFinishes after ttlSecondsAfterFinished, which deletes
// the cluster, or the RayJob itself under KubeRay's
// DELETE_RAYJOB_CR_AFTER_JOB_FINISHES (its cluster, submitter and Service
// going with it, as they are its own). A cluster picked
// by clusterSelector is never touched, but DeleteSelf, which KubeRay's
// validation allows with one, deletes the RayJob (KubeRay v1.5 and v1.6
// skip every policy of such a RayJob, so it stayed).
func finished(o observed, d *decision) {
	d.requeue = 0
	j := o.job
	stopAgain(o, d)
	if d.status.EndTime == nil {
		return
	}
	end, js := d.status.EndTime.Time, outcome(d.status)
	switch ds := j.Spec.DeletionStrategy; {
	case ds != nil && len(ds.DeletionRules) > 0:
		deletionRules(o, d, end, js)
	case ds != nil && ds.OnSuccess != nil && ds.OnFailure != nil:
		var p *rayv1.DeletionPolicyType
		switch js {
		case rayv1.JobStatusSucceeded:
			p = ds.OnSuccess.Policy
		case rayv1.JobStatusFailed:
			p = ds.OnFailure.Policy
		}
		if p != nil && *p != rayv1.DeleteNone && due(o, d, end.Add(ttl(j.Spec.TTLSecondsAfterFinished))) {
			execute(o, d, *p)
		}
	case j.Spec.ShutdownAfterJobFinishes && !selectorMode(j):
		p := rayv1.DeleteCluster
		if o.deleteAfterShutdown {
			p = rayv1.DeleteSelf
		}
		if due(o, d, end.Add(ttl(j.Spec.TTLSecondsAfterFinished))) {
			execute(o, d, p)
		}
	}
}

// outcome is the job status a finished RayJob's deletionStrategy matches:
// its Ray job's, or FAILED when the RayJob failed without the Ray job
// saying so (past its deadline, its submission failed, its cluster
// deleted: the Ray job was stopped or lost while RUNNING, or never ran).
// KubeRay v1.5 matches the Ray job's status alone, so such a RayJob's
// onFailure policy and FAILED rules never ran (v1.6 adds a
// jobDeploymentStatus condition for it).
func outcome(st rayv1.RayJobStatus) rayv1.JobStatus {
	if st.JobDeploymentStatus == rayv1.JobDeploymentStatusFailed && st.JobStatus != rayv1.JobStatusSucceeded {
		return rayv1.JobStatusFailed
	}
	return st.JobStatus
}

func ttl(s int32) time.Duration { return time.Duration(s) * time.Second }

// due reports whether at has come; if not, it asks to look again then.
func due(o observed, d *decision, at time.Time) bool {
	if o.now.Before(at) {
		wait := at.Sub(o.now) + time.Second
		if d.requeue == 0 || wait < d.requeue {
			d.requeue = wait
		}
		return false
	}
	return true
}

// deletionRules runs the most impactful rule that is due and not done yet,
// and asks to look again when the next one comes due.
func deletionRules(o observed, d *decision, end time.Time, js rayv1.JobStatus) {
	order := map[rayv1.DeletionPolicyType]int{rayv1.DeleteSelf: 4, rayv1.DeleteCluster: 3, rayv1.DeleteWorkers: 2, rayv1.DeleteNone: 1}
	var pick *rayv1.DeletionRule
	for i, r := range o.job.Spec.DeletionStrategy.DeletionRules {
		if r.Condition.JobStatus != js || !due(o, d, end.Add(ttl(r.Condition.TTLSeconds))) || done(o, r.Policy) {
			continue
		}
		if pick == nil || order[r.Policy] > order[pick.Policy] {
			pick = &o.job.Spec.DeletionStrategy.DeletionRules[i]
		}
	}
	if pick != nil {
		execute(o, d, pick.Policy)
	}
}

// done reports whether what policy asks for is already the case.
func done(o observed, p rayv1.DeletionPolicyType) bool {
	rc := o.cluster
	switch p {
	case rayv1.DeleteCluster:
		return rc == nil || rc.DeletionTimestamp != nil
	case rayv1.DeleteWorkers:
		if rc == nil || rc.DeletionTimestamp != nil {
			return true
		}
		for _, g := range rc.Spec.WorkerGroupSpecs {
			if !ptr.Deref(g.Suspend, false) {
				return false
			}
		}
		return true
	case rayv1.DeleteNone:
		return true
	}
	return false
}

func execute(o observed, d *decision, p rayv1.DeletionPolicyType) {
	if done(o, p) || (selectorMode(o.job) && p != rayv1.DeleteSelf) {
		return
	}
	switch p {
	case rayv1.DeleteCluster:
		d.deleteCluster = true
	case rayv1.DeleteWorkers:
		d.suspendWorkers = true
	case rayv1.DeleteSelf:
		d.deleteSelf = true
	}
}

// stopAgain asks again to stop the Ray job of a RayJob that gave up on it
// (Failed) while the dashboard last said it ran: the stop in the pass that
// failed the RayJob did not go through, or the manager went down before
// it. It is asked while the cluster stands, until stopRetryWindow after the
// end; the writer spaces and bounds the tries (stopJob).
func stopAgain(o observed, d *decision) {
	st := d.status
	if st.JobDeploymentStatus != rayv1.JobDeploymentStatusFailed || st.JobId == "" || st.DashboardURL == "" || st.EndTime == nil ||
		!mayStillRun(st) || o.cluster == nil || o.cluster.DeletionTimestamp != nil || !o.now.Before(st.EndTime.Add(stopRetryWindow)) {
		return
	}
	switch st.Reason {
	case rayv1.DeadlineExceeded:
		d.stopJob = "past the activeDeadlineSeconds"
	case rayv1.SubmissionFailed:
		d.stopJob = "after its submitter Job failed"
	case rayv1.JobDeploymentStatusTransitionGracePeriodExceeded:
		d.stopJob = "still running after its submitter Job finished"
	default:
		d.stopJob = "after the RayJob failed"
	}
	// Looked at again at the window's end at the latest, when the writer
	// says no sooner.
	d.requeue = st.EndTime.Add(stopRetryWindow).Sub(o.now) + time.Second
}

// mayStillRun reports whether the Ray job of a failed RayJob may still run
// as far as its status says: the dashboard last said it was PENDING or
// RUNNING, or it was still running 30 s after its submitter finished.
// That RayJob's jobStatus is FAILED (as KubeRay's) although the dashboard
// never said the job ended (no end time), unlike one failed on a job
// terminal for the grace period, which has the dashboard's end time.
func mayStillRun(st rayv1.RayJobStatus) bool {
	switch st.JobStatus {
	case rayv1.JobStatusPending, rayv1.JobStatusRunning:
		return true
	case rayv1.JobStatusFailed:
		return st.Reason == rayv1.JobDeploymentStatusTransitionGracePeriodExceeded && st.RayJobStatusInfo.EndTime == nil
	}
	return false
}
