package rayjob

import (
	"fmt"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Timings of KubeRay's RayJob controller that Loom keeps.
const (
	// requeueRunning is how often a job's status is asked while it runs or
	// its cluster comes up.
	requeueRunning = 3 * time.Second
	// submitterFinishedTimeout: a Ray job still not terminal this long after
	// its submitter Job finished is failed.
	submitterFinishedTimeout = 30 * time.Second
	// terminalGracePeriod: a Ray job terminal this long without the RayJob
	// following is finished anyway.
	terminalGracePeriod = 300 * time.Second
)

// observed is everything one pass reads: the RayJob (its spec normalized),
// its RayCluster and submitter Job (nil when absent), the cluster's
// dashboard address, what the dashboard said, the clock and the random
// names drawn for this pass (used only when the status has none yet).
type observed struct {
	job        *rayv1.RayJob
	cluster    *rayv1.RayCluster
	submitter  *batchv1.Job
	headURL    string
	dash       dashObs
	now        time.Time
	newJobID   string
	newCluster string
	invalid    error
	// submitterTrouble is why the submitter's pod does not run, asked
	// while the Ray job is not on the cluster yet ("": none said).
	submitterTrouble string
	// replacedBy is the UID of a cluster of the attempt's name that is
	// not the one the attempt runs on (AnnotationClusterUID): that one was
	// deleted and this one created since. cluster is nil then.
	replacedBy string
	// deleteAfterShutdown: shutdownAfterJobFinishes deletes the RayJob
	// (Reconciler.DeleteAfterShutdown).
	deleteAfterShutdown bool
}

// dashObs is one dashboard read: asked is false when the pass did not need
// one; failures counts the failed requests in a row (this one included)
// since the time since.
type dashObs struct {
	asked    bool
	info     *utiltypes.RayJobInfo
	notFound bool
	err      error
	failures int
	since    time.Time
}

// decision is the next status and what to do to get there.
type decision struct {
	status          rayv1.RayJobStatus
	createCluster   bool
	deleteCluster   bool
	suspendWorkers  bool
	createSubmitter bool
	deleteSubmitter bool
	ensureService   bool
	submit          bool
	deleteSelf      bool
	// bindCluster, when not "", is the UID of the cluster the attempt
	// runs on, to record (AnnotationClusterUID) before anything is
	// submitted to it.
	bindCluster string
	// stopJob, when not "", asks the dashboard to stop the Ray job of a
	// RayJob that gives up on it, saying why (past its deadline, its
	// submission failed): the cluster may stay, and the job with it.
	stopJob string
	// warn is a Warning event to record on the RayJob (reason "": none).
	warn warning
	// serviceConflict is said by the write: the RayJob-level Service's
	// name is taken ("": it is not), which the status message keeps.
	serviceConflict string
	// requeue is when to look again (0: only on a change).
	requeue time.Duration
}

// warning is a Warning event's reason and message.
type warning struct {
	reason, msg string
}

func selectorMode(j *rayv1.RayJob) bool { return len(j.Spec.ClusterSelector) != 0 }

// decide is the RayJob state machine: KubeRay's JobDeploymentStatus
// transitions, from what one pass observed.
func decide(o observed) decision {
	old := o.job.Status
	d := decision{status: *old.DeepCopy(), requeue: requeueRunning}
	st := &d.status
	st.ObservedGeneration = o.job.Generation
	// An invalid spec is ValidationFailed only while nothing of the RayJob
	// runs. A finished RayJob stays finished whatever its spec becomes
	// (once mended, ValidationFailed would start it over and run the
	// finished Ray job again); a started one holds (invalidEdit); one
	// releasing its cluster (Suspending, Retrying) finishes that first.
	switch {
	case o.invalid == nil || rayv1.IsJobDeploymentTerminal(old.JobDeploymentStatus):
	case validatedIn(old.JobDeploymentStatus):
		st.JobDeploymentStatus, st.Reason, st.Message = rayv1.JobDeploymentStatusValidationFailed, rayv1.ValidationFailed, o.invalid.Error()
		d.requeue = 0
		if old.Message != st.Message {
			d.warn = warning{reason: string(utils.InvalidRayJobSpec), msg: st.Message}
		}
		return d
	case old.JobDeploymentStatus != rayv1.JobDeploymentStatusSuspending && old.JobDeploymentStatus != rayv1.JobDeploymentStatusRetrying:
		// The deadline is kept whatever the spec became: a held RayJob
		// past it fails (and its Ray job is stopped) as any other.
		if !pastDeadline(o, &d) {
			invalidEdit(o, &d)
			return d
		}
		settle(o, &d)
		return d
	}
	switch st.JobDeploymentStatus {
	case rayv1.JobDeploymentStatusNew:
		initStatus(o, st)
	case rayv1.JobDeploymentStatusValidationFailed:
		// The spec is valid again: start over.
		st.JobDeploymentStatus, st.Reason, st.Message = rayv1.JobDeploymentStatusNew, "", ""
	case rayv1.JobDeploymentStatusInitializing:
		initializing(o, &d)
	case rayv1.JobDeploymentStatusWaiting:
		// KubeRay v1.5 waits for spec.jobId whatever suspend and the
		// deadline say: Kueue could not take the cluster back, nor the
		// deadline end the wait. A cluster gone ends it too: waited on,
		// it would be Running for a pass before it failed.
		if suspendOrDeadline(o, &d) || clusterLost(o, &d) {
			break
		}
		if o.job.Spec.JobId == "" {
			st.Message = waitingForJobID(st.DashboardURL)
			return d
		}
		if waitingOnDashboard(o, &d) {
			return d
		}
		st.JobId, st.JobDeploymentStatus, st.Message = o.job.Spec.JobId, rayv1.JobDeploymentStatusRunning, ""
	case rayv1.JobDeploymentStatusRunning:
		running(o, &d)
	case rayv1.JobDeploymentStatusSuspending, rayv1.JobDeploymentStatusRetrying:
		tearDown(o, &d)
	case rayv1.JobDeploymentStatusSuspended:
		d.requeue = 0
		if !o.job.Spec.Suspend {
			st.JobStatus, st.JobDeploymentStatus = rayv1.JobStatusNew, rayv1.JobDeploymentStatusNew
		}
		return d
	case rayv1.JobDeploymentStatusComplete, rayv1.JobDeploymentStatusFailed:
		finished(o, &d)
		return d
	default:
		st.Message = fmt.Sprintf("unknown jobDeploymentStatus %q", st.JobDeploymentStatus)
		return d
	}
	settle(o, &d)
	return d
}

// settle counts the pass's outcome (and retries a failure with retries
// left), stamps the end of a RayJob that has just finished and looks
// again no later than its deadline.
func settle(o observed, d *decision) {
	st := &d.status
	countAndRetry(o.job, st)
	if rayv1.IsJobDeploymentTerminal(st.JobDeploymentStatus) && !rayv1.IsJobDeploymentTerminal(o.job.Status.JobDeploymentStatus) {
		st.EndTime = &metav1.Time{Time: o.now}
	}
	d.requeue = nextLook(o, *st, d.requeue)
}

// validatedIn reports whether a RayJob in jds, of which nothing runs (New,
// Suspended), goes to ValidationFailed when its spec is invalid.
func validatedIn(jds rayv1.JobDeploymentStatus) bool {
	return jds == rayv1.JobDeploymentStatusNew || jds == rayv1.JobDeploymentStatusValidationFailed || jds == rayv1.JobDeploymentStatusSuspended
}

// invalidEdit holds a started RayJob (Initializing, Waiting, Running)
// whose spec was edited into an invalid one where it is: nothing is
// created, deleted, submitted or stopped on the strength of that spec, and
// no state is left for another, so its cluster stays owned and its Ray job
// runs on, followed (status.jobStatus). The message and a Warning say why;
// once the spec is mended, the RayJob goes on from where it held. Only its
// deadline (pastDeadline, in decide) still ends it; it is looked at again
// then.
// (KubeRay v1.5 moves it to ValidationFailed and follows it no more.)
func invalidEdit(o observed, d *decision) {
	st := &d.status
	d.requeue = 0
	if o.dash.asked {
		d.requeue = requeueRunning
	}
	// Only a Running RayJob's Ray job is followed: a Waiting one's dashboard
	// was asked of the user's spec.jobId, not yet its job.
	if o.dash.info != nil && st.JobDeploymentStatus == rayv1.JobDeploymentStatusRunning {
		st.JobStatus = o.dash.info.JobStatus
	}
	st.Message = fmt.Sprintf("the RayJob holds as it is until its spec is mended (nothing is created, deleted or submitted; Ray job %s is followed): %v", st.JobId, o.invalid)
	if o.job.Status.Message != st.Message {
		d.warn = warning{reason: string(utils.InvalidRayJobSpec), msg: st.Message}
	}
	d.requeue = nextLook(o, *st, d.requeue)
}

// waitingOnDashboard keeps an InteractiveMode RayJob waiting while its
// cluster's dashboard does not know spec.jobId, and reports whether it
// does. After a suspension or a retry the attempt runs on a new cluster,
// but spec.jobId still names the earlier attempt's Ray job, which went with
// its cluster: taken as is, the new attempt would follow a job no one
// submitted to it. The user submits the new attempt's job (a new id, or
// the same one again) and the RayJob runs once the dashboard has it. A
// cluster gone is not waited on: running says it was lost.
func waitingOnDashboard(o observed, d *decision) bool {
	st := &d.status
	switch {
	case !o.dash.asked || o.dash.info != nil:
		return false
	case o.dash.err != nil:
		d.requeue = dashboardBackoff(o.dash.failures)
		st.Message = fmt.Sprintf("cannot ask the Ray dashboard at %s for spec.jobId %s (%d failed requests since %s): %v; asking again in %s",
			st.DashboardURL, o.job.Spec.JobId, o.dash.failures, o.dash.since.UTC().Format(time.RFC3339), o.dash.err, d.requeue)
	default:
		st.Message = fmt.Sprintf("waiting for spec.jobId %s to be on RayCluster %s (a Ray job of an earlier attempt went with its cluster): submit the Ray job to the dashboard at %s with that submission id, or set spec.jobId to the new one",
			o.job.Spec.JobId, st.RayClusterName, st.DashboardURL)
	}
	d.requeue = nextLook(o, *st, d.requeue)
	return true
}

func waitingForJobID(dashboard string) string {
	return fmt.Sprintf("waiting for spec.jobId: submit the Ray job to the dashboard at %s and set spec.jobId to its submission id", dashboard)
}

// nextLook is wait (0: only on a change), or less when the RayJob's
// activeDeadlineSeconds comes first while its deadline is watched
// (Initializing, Waiting, Running): a longer wait (an unreachable
// dashboard's backoff, a RayJob held on an invalid edit) would fail it
// late.
func nextLook(o observed, st rayv1.RayJobStatus, wait time.Duration) time.Duration {
	ads := o.job.Spec.ActiveDeadlineSeconds
	if ads == nil || *ads <= 0 || st.StartTime == nil || !deadlineWatched(st.JobDeploymentStatus) {
		return wait
	}
	if left := st.StartTime.Add(time.Duration(*ads)*time.Second).Sub(o.now) + time.Second; wait == 0 || left < wait {
		return max(left, time.Second)
	}
	return wait
}

// initStatus names the Ray job and the cluster before anything is created
// or submitted, so that a restart submits the same job to the same
// cluster.
func initStatus(o observed, st *rayv1.RayJobStatus) {
	spec := o.job.Spec
	if spec.SubmissionMode != rayv1.InteractiveMode && st.JobId == "" {
		st.JobId = spec.JobId
		if st.JobId == "" {
			st.JobId = o.newJobID
		}
	}
	if st.RayClusterName == "" {
		st.RayClusterName = spec.ClusterSelector[utils.RayJobClusterSelectorKey]
		if st.RayClusterName == "" {
			st.RayClusterName = o.newCluster
		}
	}
	st.JobDeploymentStatus = rayv1.JobDeploymentStatusInitializing
	st.StartTime = &metav1.Time{Time: o.now}
	st.Reason, st.Message = "", ""
}

// deadlineWatched reports whether a RayJob in jds fails at its
// activeDeadlineSeconds: once started, until it finishes or releases its
// cluster.
func deadlineWatched(jds rayv1.JobDeploymentStatus) bool {
	return jds == rayv1.JobDeploymentStatusInitializing || jds == rayv1.JobDeploymentStatusWaiting || jds == rayv1.JobDeploymentStatusRunning
}

// suspendOrDeadline moves a RayJob asked to suspend to Suspending, and one
// past its activeDeadlineSeconds to Failed; it reports whether it did.
func suspendOrDeadline(o observed, d *decision) bool {
	if o.job.Spec.Suspend {
		d.status.JobDeploymentStatus = rayv1.JobDeploymentStatusSuspending
		return true
	}
	return pastDeadline(o, d)
}

// pastDeadline fails a RayJob past its activeDeadlineSeconds
// (DeadlineExceeded) and reports whether it did. Its Ray job, if it may
// still run, is stopped, as a batch Job's pods are. A deadline that is not
// positive (an invalid edit) is none.
func pastDeadline(o observed, d *decision) bool {
	st := &d.status
	ads := o.job.Spec.ActiveDeadlineSeconds
	if ads == nil || *ads <= 0 || st.StartTime == nil || o.now.Before(st.StartTime.Add(time.Duration(*ads)*time.Second)) {
		return false
	}
	st.JobDeploymentStatus, st.Reason = rayv1.JobDeploymentStatusFailed, rayv1.DeadlineExceeded
	st.Message = fmt.Sprintf("The RayJob has passed the activeDeadlineSeconds. StartTime: %s. ActiveDeadlineSeconds: %d",
		st.StartTime.UTC().Format(time.RFC3339), *ads)
	stopRayJob(o, d, "past the activeDeadlineSeconds")
	return true
}

// stopRayJob asks to stop the Ray job of a RayJob that gives up on it (why)
// while it may still run: submitted (its id and dashboard known) and not
// known to have finished.
func stopRayJob(o observed, d *decision, why string) {
	st := d.status
	if st.JobId != "" && st.DashboardURL != "" && !rayv1.IsJobTerminal(o.job.Status.JobStatus) && !o.dashTerminal() {
		d.stopJob = why
	}
}

// clusterPresent asks for the cluster when it is missing (or says that the
// selected one is missing) and reports whether it is there.
func clusterPresent(o observed, d *decision) bool {
	if o.cluster != nil {
		return true
	}
	if selectorMode(o.job) {
		d.status.Message = fmt.Sprintf("RayCluster %s/%s named by the clusterSelector (%s) does not exist: create it or fix the selector",
			o.job.Namespace, d.status.RayClusterName, utils.RayJobClusterSelectorKey)
		return false
	}
	d.createCluster = true
	d.status.Message = fmt.Sprintf("creating RayCluster %s", d.status.RayClusterName)
	return false
}

// initializing brings the cluster up, learns its dashboard address and
// starts the submission.
func initializing(o observed, d *decision) {
	st := &d.status
	if isVerdict(st.Reason) {
		st.Reason = "" // said again below while it stands
	}
	if suspendOrDeadline(o, d) || !clusterPresent(o, d) || heldByCluster(o, d) {
		return
	}
	if st.DashboardURL == "" {
		if o.cluster.Status.State != rayv1.Ready {
			st.Message = fmt.Sprintf("waiting for RayCluster %s to be ready%s", o.cluster.Name, clusterProblem(o.cluster))
			return
		}
		if o.headURL == "" {
			st.Message = fmt.Sprintf("waiting for the head Service of RayCluster %s", o.cluster.Name)
			return
		}
		st.DashboardURL = o.headURL
	}
	bind(o, d)
	switch o.job.Spec.SubmissionMode {
	case rayv1.InteractiveMode:
		st.JobDeploymentStatus = rayv1.JobDeploymentStatusWaiting
		st.Message = waitingForJobID(st.DashboardURL)
		return
	case rayv1.K8sJobMode:
		d.createSubmitter = o.submitter == nil
	}
	st.JobDeploymentStatus, st.Message = rayv1.JobDeploymentStatusRunning, ""
}

// AnnotationClusterUID, on a RayJob, is the UID of the RayCluster its
// attempt runs on, recorded before anything is submitted to it: a cluster
// of that name with another UID (a selected cluster deleted and created
// again) is not the attempt's, whose Ray job went with the one deleted.
// KubeRay's status names the cluster only.
const AnnotationClusterUID = "ray.loom.dev/cluster-uid"

// bind asks to record the cluster the attempt runs on, when the RayJob
// does not name it already.
func bind(o observed, d *decision) {
	if o.cluster != nil && o.cluster.UID != "" && o.job.Annotations[AnnotationClusterUID] != string(o.cluster.UID) {
		d.bindCluster = string(o.cluster.UID)
	}
}

// heldByCluster says, before anything is submitted, that the cluster's
// own verdict (it can never fit, its gang is held, it is stalled) keeps
// the job from running, and reports whether it does. It is asked even of
// a cluster that reads ready: the submission waits until the cluster and
// the inventory agree. A new or changed verdict is also a Warning event.
func heldByCluster(o observed, d *decision) bool {
	reason, msg := clusterVerdict(o.cluster)
	if reason == "" {
		return false
	}
	st := &d.status
	st.Reason, st.Message = reason, msg
	if old := o.job.Status; old.Reason != reason || old.Message != msg {
		d.warn = warning{reason: string(reason), msg: msg}
	}
	return true
}
