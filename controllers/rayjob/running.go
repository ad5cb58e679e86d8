package rayjob

import (
	"fmt"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// running follows the Ray job on the dashboard (and, in K8sJobMode, the
// submitter Job) until both say it is over.
func running(o observed, d *decision) {
	st := &d.status
	if suspendOrDeadline(o, d) {
		return
	}
	if terminalTooLong(o, st) || clusterLost(o, d) || !clusterPresent(o, d) {
		return
	}
	// One started by a Loom that did not record it runs on this one.
	bind(o, d)
	d.ensureService = !selectorMode(o.job)
	var finishedAt *time.Time
	if o.job.Spec.SubmissionMode == rayv1.K8sJobMode {
		if o.submitter == nil {
			d.createSubmitter = true
		} else {
			var failed *batchv1.JobCondition
			finishedAt, failed = submitterFinished(o.submitter)
			if failed != nil {
				st.JobDeploymentStatus, st.Reason = rayv1.JobDeploymentStatusFailed, rayv1.AppFailed
				if st.JobStatus != rayv1.JobStatusFailed {
					st.Reason = rayv1.SubmissionFailed
					st.Message = fmt.Sprintf("Job submission has failed. Reason: %s. Message: %s", failed.Reason, failed.Message)
					// The submitter may have failed after the Ray job
					// was submitted (its log follower evicted): the
					// job would run on, followed by no one.
					stopRayJob(o, d, "after its submitter Job failed")
				}
				return
			}
			if finishedAt != nil && !o.now.Before(finishedAt.Add(submitterFinishedTimeout)) && !o.dashTerminal() {
				st.JobStatus, st.JobDeploymentStatus = rayv1.JobStatusFailed, rayv1.JobDeploymentStatusFailed
				st.Reason = rayv1.JobDeploymentStatusTransitionGracePeriodExceeded
				st.Message = fmt.Sprintf("The RayJob submitter finished at %s but the Ray job did not reach a terminal state within %s",
					finishedAt.UTC().Format(time.RFC3339), submitterFinishedTimeout)
				stopRayJob(o, d, "still running after its submitter Job finished")
				return
			}
		}
	}
	followDashboard(o, d, finishedAt)
}

// clusterLost ends the attempt of a RayJob whose cluster was deleted while
// it ran, or waited for spec.jobId (InteractiveMode), (by hand: Loom
// deletes a created one only once the RayJob finished, or to suspend or
// retry, and never one picked by clusterSelector): its Ray job went with
// it, Failed, unless it had finished. KubeRay v1.5 creates a created cluster again, which runs the
// job a second time, uncounted, on the rayClusterSpec as edited since, and
// leaves a RayJob whose selected cluster is gone Running for ever; here, a
// retry (backoffLimit) starts over on a new cluster, and one on a selected
// cluster fails naming it. A cluster of its name created since (replacedBy)
// is not the attempt's: the job is not submitted or followed there. A
// submitter Job still running is deleted, so that it submits nothing to
// such a cluster.
func clusterLost(o observed, d *decision) bool {
	if o.cluster != nil && o.cluster.DeletionTimestamp == nil {
		return false
	}
	st := &d.status
	name, deleted := "RayCluster "+st.RayClusterName, "was deleted"
	if selectorMode(o.job) {
		name += " (picked by the clusterSelector)"
	}
	if o.replacedBy != "" {
		deleted = fmt.Sprintf("was deleted and created again (UID %s, now %s)", o.job.Annotations[AnnotationClusterUID], o.replacedBy)
	}
	if o.submitter != nil && o.submitter.DeletionTimestamp == nil {
		if at, _ := submitterFinished(o.submitter); at == nil {
			d.deleteSubmitter = true
		}
	}
	if rayv1.IsJobTerminal(st.JobStatus) {
		st.JobDeploymentStatus, st.Reason = rayv1.JobDeploymentStatusComplete, ""
		if st.JobStatus == rayv1.JobStatusFailed {
			st.JobDeploymentStatus, st.Reason = rayv1.JobDeploymentStatusFailed, rayv1.AppFailed
		}
		st.Message = fmt.Sprintf("%s %s after Ray job %s ended %s", name, deleted, st.JobId, st.JobStatus)
		return true
	}
	st.JobStatus, st.JobDeploymentStatus, st.Reason = rayv1.JobStatusFailed, rayv1.JobDeploymentStatusFailed, rayv1.AppFailed
	st.Message = fmt.Sprintf("%s %s while the RayJob ran on it: Ray job %s is lost with it", name, deleted, st.JobId)
	if st.JobId == "" { // an InteractiveMode RayJob Waiting for spec.jobId
		st.Message = fmt.Sprintf("%s %s while the RayJob waited for its Ray job (spec.jobId) on it", name, deleted)
	}
	return true
}

func (o observed) dashTerminal() bool {
	return o.dash.info != nil && rayv1.IsJobTerminal(o.dash.info.JobStatus)
}

// followDashboard turns what the dashboard said into the status.
func followDashboard(o observed, d *decision, finishedAt *time.Time) {
	st := &d.status
	switch {
	case !o.dash.asked:
		return
	case o.dash.err != nil:
		wait := nextLook(o, *st, dashboardBackoff(o.dash.failures))
		st.Message = fmt.Sprintf("cannot reach the Ray dashboard at %s (%d failed requests since %s): %v; asking again in %s",
			st.DashboardURL, o.dash.failures, o.dash.since.UTC().Format(time.RFC3339), o.dash.err, wait)
		d.requeue = wait
		return
	case o.dash.notFound:
		switch {
		case o.job.Spec.SubmissionMode == rayv1.HTTPMode && st.JobStatus != "" && st.JobStatus != rayv1.JobStatusNew:
			// The dashboard had the job (its head restarted without GCS
			// fault tolerance, its job table lost): submitted again, it
			// would run a second time, uncounted. KubeRay v1.5 submits it
			// again.
			st.JobDeploymentStatus, st.Reason = rayv1.JobDeploymentStatusFailed, rayv1.AppFailed
			st.Message = fmt.Sprintf("Ray job %s, which the dashboard had as %s, is no longer on RayCluster %s (its head restarted without GCS fault tolerance?): it is not submitted again, which would run it a second time",
				st.JobId, st.JobStatus, st.RayClusterName)
			st.JobStatus = rayv1.JobStatusFailed
		case o.job.Spec.SubmissionMode == rayv1.HTTPMode:
			d.submit = true
			st.Message = fmt.Sprintf("submitting Ray job %s to %s", st.JobId, st.DashboardURL)
		case finishedAt != nil:
			st.JobDeploymentStatus, st.Reason = rayv1.JobDeploymentStatusFailed, rayv1.AppFailed
			st.Message = "Submitter completed but Ray job not found in RayCluster."
		case o.job.Spec.SubmissionMode == rayv1.K8sJobMode:
			st.Message = fmt.Sprintf("waiting for the submitter Job %s to submit Ray job %s", o.job.Name, st.JobId)
			if o.submitterTrouble != "" {
				st.Message += ": " + o.submitterTrouble
			}
		default:
			st.Message = fmt.Sprintf("Ray job %s is not on RayCluster %s yet", st.JobId, st.RayClusterName)
		}
		return
	}
	info := o.dash.info
	jds, reason := rayv1.JobDeploymentStatusRunning, rayv1.JobFailedReason("")
	terminal := rayv1.IsJobTerminal(info.JobStatus)
	if o.job.Spec.SubmissionMode == rayv1.K8sJobMode {
		terminal = terminal && finishedAt != nil
	}
	if terminal {
		jds = rayv1.JobDeploymentStatusComplete
		if info.JobStatus == rayv1.JobStatusFailed {
			jds, reason = rayv1.JobDeploymentStatusFailed, rayv1.AppFailed
		}
	}
	st.RayClusterStatus = *o.cluster.Status.DeepCopy()
	st.JobStatus, st.JobDeploymentStatus, st.Reason, st.Message = info.JobStatus, jds, reason, info.Message
	if info.StartTime != 0 {
		st.RayJobStatusInfo.StartTime = rayTime(info.StartTime)
	}
	if info.EndTime != 0 {
		st.RayJobStatusInfo.EndTime = rayTime(info.EndTime)
	}
}

// rayTime is a time the dashboard gives in milliseconds, to the second as
// the status keeps it: with its milliseconds, it would differ from the
// stored copy on every poll and write the status each time.
func rayTime(ms uint64) *metav1.Time {
	t := metav1.NewTime(time.UnixMilli(int64(ms))).Rfc3339Copy() //nolint:gosec // Ray keeps int64 milliseconds
	return &t
}

// terminalTooLong finishes a RayJob whose Ray job has been terminal for
// the grace period without the RayJob following (a submitter that never
// finishes).
func terminalTooLong(o observed, st *rayv1.RayJobStatus) bool {
	end := st.RayJobStatusInfo.EndTime
	if !rayv1.IsJobTerminal(st.JobStatus) || end == nil || o.now.Before(end.Add(terminalGracePeriod)) {
		return false
	}
	st.JobDeploymentStatus = rayv1.JobDeploymentStatusComplete
	if st.JobStatus == rayv1.JobStatusFailed {
		st.JobDeploymentStatus = rayv1.JobDeploymentStatusFailed
	}
	st.Reason = rayv1.JobDeploymentStatusTransitionGracePeriodExceeded
	st.Message = "JobDeploymentStatus does not transition to Complete or Failed within the grace period after JobStatus reaches a terminal state."
	return true
}

// submitterFinished is when the submitter Job finished (nil: not yet) and
// its Failed condition, if it failed.
func submitterFinished(j *batchv1.Job) (*time.Time, *batchv1.JobCondition) {
	var at *time.Time
	var failed *batchv1.JobCondition
	for i := range j.Status.Conditions {
		c := &j.Status.Conditions[i]
		if c.Status != corev1.ConditionTrue || (c.Type != batchv1.JobComplete && c.Type != batchv1.JobFailed) {
			continue
		}
		if c.Type == batchv1.JobFailed {
			failed = c
		}
		if !c.LastTransitionTime.IsZero() && at == nil {
			t := c.LastTransitionTime.Time
			at = &t
		}
	}
	return at, failed
}

// tearDown deletes the cluster and the submitter (before a suspension or a
// retry), then resets the Ray job's part of the status.
func tearDown(o observed, d *decision) {
	st := &d.status
	clusterGone := selectorMode(o.job) || o.cluster == nil
	submitterGone := o.job.Spec.SubmissionMode != rayv1.K8sJobMode || o.submitter == nil
	d.deleteCluster = !clusterGone && o.cluster.DeletionTimestamp == nil
	d.deleteSubmitter = !submitterGone && o.submitter.DeletionTimestamp == nil
	if !clusterGone || !submitterGone {
		st.Message = fmt.Sprintf("releasing RayCluster %s and the submitter Job before %s", st.RayClusterName,
			map[bool]string{true: "suspending", false: "retrying"}[st.JobDeploymentStatus == rayv1.JobDeploymentStatusSuspending])
		return
	}
	st.RayClusterStatus = rayv1.RayClusterStatus{}
	st.RayClusterName, st.DashboardURL, st.JobId, st.Message, st.Reason = "", "", "", "", ""
	st.RayJobStatusInfo = rayv1.RayJobStatusInfo{}
	st.JobStatus = rayv1.JobStatusNew
	if st.JobDeploymentStatus == rayv1.JobDeploymentStatusSuspending {
		st.JobDeploymentStatus = rayv1.JobDeploymentStatusSuspended
	} else {
		st.JobDeploymentStatus = rayv1.JobDeploymentStatusNew
	}
}

// countAndRetry counts a pass's success or failure and turns a failure
// with retries left (backoffLimit) into Retrying: a new cluster, a new
// submission id. A deadline is not retried.
func countAndRetry(j *rayv1.RayJob, st *rayv1.RayJobStatus) {
	failed, succeeded := ptr.Deref(st.Failed, 0), ptr.Deref(st.Succeeded, 0)
	if st.JobDeploymentStatus == rayv1.JobDeploymentStatusFailed {
		failed++
	}
	if st.JobStatus == rayv1.JobStatusSucceeded && st.JobDeploymentStatus == rayv1.JobDeploymentStatusComplete {
		succeeded++
	}
	st.Failed, st.Succeeded = ptr.To(failed), ptr.To(succeeded)
	if j.Spec.BackoffLimit == nil {
		return
	}
	// In 64 bits: a backoffLimit of MaxInt32 means (nearly) unlimited
	// retries, not an overflow to none.
	attempts := int64(*j.Spec.BackoffLimit) + 1
	if st.JobDeploymentStatus == rayv1.JobDeploymentStatusFailed && int64(failed) < attempts && st.Reason != rayv1.DeadlineExceeded {
		st.JobDeploymentStatus = rayv1.JobDeploymentStatusRetrying
		st.Message = fmt.Sprintf("attempt %d of %d failed (%s): %s; retrying on a new RayCluster", failed, attempts, st.Reason, st.Message)
	}
}
