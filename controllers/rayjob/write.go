package rayjob

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/dashboardclient"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/loom-dev/loom/internal/apply"
)

// ReasonNameConflict is the Warning of a child's name taken by an object
// the RayJob does not control, which Loom leaves alone.
const ReasonNameConflict = "NameConflict"

// serviceConflictNote follows the name conflict of the RayJob-level head
// Service in the status message of a RayJob running without it.
const serviceConflictNote = ": the RayJob runs without its own head Service; rename the RayJob or that Service to have it"

// withConflict is a message with the RayJob-level Service's name conflict
// (conflict, "" for none) said after it.
func withConflict(msg, conflict string) string {
	switch {
	case conflict == "" || strings.Contains(msg, conflict):
		return msg
	case msg == "":
		return conflict
	}
	return msg + "; " + conflict
}

// ReasonFailedToSubmit is the Warning of an HTTPMode submission the
// dashboard refused or did not answer (KubeRay has no event for it).
const ReasonFailedToSubmit = "FailedToSubmitRayJob"

// stepError is a step of a pass that failed, with the reason of the
// Warning event that says so (KubeRay's reasons: FailedToCreateRayCluster
// and the like).
type stepError struct {
	reason string
	err    error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// failed is err (nil: nil) as the failure of a step of reason.
func failed(reason utils.K8sEventType, err error) error {
	if err == nil {
		return nil
	}
	return &stepError{reason: string(reason), err: err}
}

// write makes the children what the decision says, then submits.
func (r *Reconciler) write(ctx context.Context, o observed, d *decision) error {
	owner := o.job
	// Said first: a pass whose later step meets a conflict still writes
	// the decided status, whose message the Warning is not said again for.
	if d.warn.reason != "" {
		r.event(owner, corev1.EventTypeWarning, d.warn.reason, "%s", d.warn.msg)
	}
	// A create that finds the child made (the cache behind an earlier
	// pass's create) records no second Created event.
	if d.createCluster {
		created, err := r.writer.EnsureNew(ctx, owner, desiredCluster(o.job, d.status.RayClusterName))
		if err != nil {
			return failed(utils.FailedToCreateRayCluster, err)
		}
		if created {
			r.event(owner, corev1.EventTypeNormal, "CreatedRayCluster", "Created RayCluster %s/%s", owner.Namespace, d.status.RayClusterName)
		}
	}
	if d.createSubmitter && o.cluster != nil {
		sj, err := desiredSubmitter(o.job, d.status, o.cluster)
		if err != nil {
			return failed(utils.FailedToCreateRayJobSubmitter, err)
		}
		created, err := r.writer.EnsureNew(ctx, owner, sj)
		if err != nil {
			return failed(utils.FailedToCreateRayJobSubmitter, err)
		}
		if created {
			r.event(owner, corev1.EventTypeNormal, "CreatedRayJobSubmitter", "Created Kubernetes Job %s/%s", sj.Namespace, sj.Name)
		}
	}
	if d.ensureService && o.cluster != nil {
		svc, err := desiredService(ctx, o.job, o.cluster)
		if err != nil {
			return failed(utils.FailedToCreateService, err)
		}
		// The RayJob-level Service is a convenience, a name that follows
		// the job from cluster to cluster: one of that name the RayJob
		// does not control (the head Service of a RayCluster named as the
		// RayJob) is left alone, and the job goes on without it. While it
		// stands, the status message says so, and a Warning once: when
		// the stored message did not say it yet, so a restart warns of
		// nothing new.
		err = r.writer.Ensure(ctx, owner, svc)
		if err != nil && !apply.IsForeign(err) {
			return failed(utils.FailedToCreateService, err)
		}
		if err != nil {
			d.serviceConflict = err.Error() + serviceConflictNote
			if !strings.Contains(o.job.Status.Message, d.serviceConflict) {
				r.event(owner, corev1.EventTypeWarning, ReasonNameConflict, "%s", d.serviceConflict)
			}
		}
	}
	if err := r.release(ctx, o, *d); err != nil {
		return err
	}
	if d.stopJob != "" {
		r.stopJob(ctx, o.job, d, d.stopJob, o.now)
	}
	if d.deleteSelf {
		return failed("FailedToDeleteRayJob", r.writer.Delete(ctx, owner, "DeleteSelf after the RayJob finished"))
	}
	if d.submit {
		return failed(ReasonFailedToSubmit, r.submit(ctx, o, d.status))
	}
	return nil
}

// release deletes the cluster and the submitter, or suspends the workers.
func (r *Reconciler) release(ctx context.Context, o observed, d decision) error {
	if d.deleteCluster && o.cluster != nil {
		if err := r.writer.Remove(ctx, o.job, o.cluster); err != nil {
			return failed(utils.FailedToDeleteRayCluster, err)
		}
		r.event(o.job, corev1.EventTypeNormal, "DeletedRayCluster", "Deleted cluster %s/%s", o.cluster.Namespace, o.cluster.Name)
	}
	if d.deleteSubmitter && o.submitter != nil {
		if err := r.writer.Remove(ctx, o.job, o.submitter); err != nil {
			return failed(utils.FailedToDeleteRayJobSubmitter, err)
		}
	}
	if d.suspendWorkers && o.cluster != nil {
		// The cluster as it runs, not the RayJob's rayClusterSpec: edits
		// made to it since the cluster was created are disregarded, and
		// must not reach the head now.
		rc := desiredCluster(o.job, o.cluster.Name)
		rc.Spec = *o.cluster.Spec.DeepCopy()
		for i := range rc.Spec.WorkerGroupSpecs {
			rc.Spec.WorkerGroupSpecs[i].Suspend = ptr.To(true)
		}
		if err := r.writer.Ensure(ctx, o.job, rc); err != nil {
			return failed(utils.FailedToUpdateRayCluster, err)
		}
	}
	return nil
}

// submit sends the Ray job to the dashboard (HTTPMode). The job id is in
// the status already and the dashboard said it does not know it.
func (r *Reconciler) submit(ctx context.Context, o observed, st rayv1.RayJobStatus) error {
	j := o.job.DeepCopy()
	j.Status = st
	req, err := dashboardclient.ConvertRayJobToReq(j)
	if err != nil {
		return fmt.Errorf("building the submission of Ray job %s: %w", st.JobId, err)
	}
	cctx, cancel := context.WithTimeout(ctx, DashboardTimeout)
	defer cancel()
	_, err = r.DashboardFor(st.DashboardURL).Submit(cctx, req)
	if err != nil && strings.Contains(err.Error(), "already exists") {
		err = nil // submitted by an earlier pass whose answer was lost
	}
	r.recordDashboard(client.ObjectKeyFromObject(j), err, time.Now())
	if err != nil {
		return fmt.Errorf("submitting Ray job %s to %s: %w", st.JobId, st.DashboardURL, err)
	}
	r.event(o.job, corev1.EventTypeNormal, "SubmittedRayJob", "Submitted Ray job %s to RayCluster %s", st.JobId, st.RayClusterName)
	return nil
}

// Stopping a given-up Ray job is tried again with backoff (1 s, 2 s, 4 s …
// up to a minute) while its cluster stands, at most stopTries times, and
// not past stopRetryWindow after the RayJob ended. The tries are counted
// in memory and said in the status message after each failure, from which
// a restarted manager takes the count up (triedBefore): a restart tries
// again at once, but never more than stopTries times in all.
const (
	stopTries       = 8
	stopRetryWindow = 10 * time.Minute
)

// stopNote starts what a finished RayJob's message says of a stop that
// failed, after the message of its end.
const stopNote = "; stopping Ray job "

// stopAttempts is what the reconciler keeps of a RayJob's failed stops: of
// which Ray job, how many, when to try again, and whether it gave up.
type stopAttempts struct {
	jobID string
	n     int
	next  time.Time
	done  bool
}

// stopJob asks the dashboard to stop the Ray job of a RayJob that gives up
// on it (why: past its deadline, after its submitter failed): the RayJob
// fails whether the dashboard answers or not. A stopped job's jobStatus
// becomes STOPPED, with a StoppedRayJob event; a job the dashboard does not
// know was never submitted (or is gone), and is not asked of again (the
// message says no more of earlier failed stops). A failed stop is tried
// again later (stopTries, with backoff): the first
// failure and the last are FailedToStopRayJob Warnings, not every one, and
// the message says how many failed and when the next try is.
func (r *Reconciler) stopJob(ctx context.Context, job *rayv1.RayJob, d *decision, why string, now time.Time) {
	st := &d.status
	key := client.ObjectKeyFromObject(job)
	r.mu.Lock()
	a := r.stops[key]
	r.mu.Unlock()
	if a.jobID != st.JobId {
		a = triedBefore(job.Status.Message, st.JobId)
	}
	if a.done {
		return
	}
	if now.Before(a.next) {
		d.requeue = soonest(d.requeue, a.next.Sub(now))
		return
	}
	cctx, cancel := context.WithTimeout(ctx, DashboardTimeout)
	defer cancel()
	err := r.DashboardFor(st.DashboardURL).Stop(cctx, st.JobId)
	base, _, _ := strings.Cut(st.Message, stopNote)
	switch {
	case errors.Is(err, ErrJobNotFound):
		a.done = true
		st.Message = base
	case err != nil:
		a.n++
		if a.n >= stopTries {
			a.done = true
			st.Message = fmt.Sprintf("%s%s%s failed %d times, the last: %v; Loom tries no more", base, stopNote, st.JobId, a.n, err)
			r.event(job, corev1.EventTypeWarning, "FailedToStopRayJob", "Could not stop Ray job %s %s on RayCluster %s: %v; gave up after %d tries", st.JobId, why, st.RayClusterName, err, a.n)
			break
		}
		wait := dashboardBackoff(a.n)
		a.next = now.Add(wait)
		d.requeue = soonest(d.requeue, wait)
		st.Message = fmt.Sprintf("%s%s%s failed (%d of %d tries): %v; trying again in %s", base, stopNote, st.JobId, a.n, stopTries, err, wait)
		if a.n == 1 {
			r.event(job, corev1.EventTypeWarning, "FailedToStopRayJob", "Could not stop Ray job %s %s on RayCluster %s: %v; trying again in %s, up to %d times",
				st.JobId, why, st.RayClusterName, err, wait, stopTries)
		}
	default:
		a.done = true
		st.JobStatus, st.Message = rayv1.JobStatusStopped, base
		r.event(job, corev1.EventTypeNormal, "StoppedRayJob", "Stopped Ray job %s %s on RayCluster %s", st.JobId, why, st.RayClusterName)
	}
	r.mu.Lock()
	if r.stops == nil {
		r.stops = map[types.NamespacedName]stopAttempts{}
	}
	r.stops[key] = a
	r.mu.Unlock()
}

// triedBefore is what a RayJob's stored message (msg) says of the failed
// stops of Ray job id, which stopJob says after each: how many failed, and
// whether Loom gave up. The count so outlives the manager, without a
// write of its own.
func triedBefore(msg, id string) stopAttempts {
	a := stopAttempts{jobID: id}
	_, note, ok := strings.Cut(msg, stopNote+id+" failed ")
	switch {
	case !ok:
	case strings.HasPrefix(note, "("):
		_, _ = fmt.Sscanf(note, "(%d of", &a.n)
	default:
		_, err := fmt.Sscanf(note, "%d times", &a.n)
		a.done = err == nil
	}
	return a
}

// soonest is the shorter of two waits, 0 being none.
func soonest(a, b time.Duration) time.Duration {
	if a == 0 || b < a {
		return b
	}
	return a
}

// addFinalizer adds KubeRay's stop-job finalizer to a new RayJob, so that
// deleting it stops its Ray job.
func (r *Reconciler) addFinalizer(ctx context.Context, job *rayv1.RayJob) error {
	if job.Status.JobDeploymentStatus != rayv1.JobDeploymentStatusNew || controllerutil.ContainsFinalizer(job, utils.RayJobStopJobFinalizer) {
		return nil
	}
	patch := client.MergeFromWithOptions(job.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.AddFinalizer(job, utils.RayJobStopJobFinalizer)
	return r.writer.Patch(ctx, job, patch, "add the stop-job finalizer")
}

// finalize stops a deleted RayJob's Ray job if it may still run, then
// removes the finalizer whether the stop worked or not (as KubeRay).
func (r *Reconciler) finalize(ctx context.Context, job *rayv1.RayJob) error {
	if !controllerutil.ContainsFinalizer(job, utils.RayJobStopJobFinalizer) {
		return nil
	}
	st := job.Status
	if !rayv1.IsJobTerminal(st.JobStatus) && st.DashboardURL != "" && st.JobId != "" {
		cctx, cancel := context.WithTimeout(ctx, DashboardTimeout)
		err := r.DashboardFor(st.DashboardURL).Stop(cctx, st.JobId)
		cancel()
		if err != nil {
			log.FromContext(ctx).Info("could not stop the Ray job of a deleted RayJob", "jobId", st.JobId, "error", err.Error())
		}
	}
	patch := client.MergeFromWithOptions(job.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(job, utils.RayJobStopJobFinalizer)
	r.forget(client.ObjectKeyFromObject(job))
	return r.writer.Patch(ctx, job, patch, "remove the stop-job finalizer")
}

func (r *Reconciler) event(obj *rayv1.RayJob, kind, reason, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, nil, kind, reason, reason, format, args...)
	}
}
