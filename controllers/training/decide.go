package training

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/podset"
)

// observed is everything one reconcile knows besides the job itself.
type observed struct {
	// pods are the job's pods as the cache shows them, plus the pods created
	// but not yet seen (expectations), with an empty phase.
	pods []*corev1.Pod
	// podGroup is the job's PodGroup; nil when absent or not used.
	podGroup *schedulingv1beta1.PodGroup
	// volcano: the PodGroup CRD is installed.
	volcano bool
	// queue is what stops Volcano from admitting the gang to the queue it
	// names (none, or Volcano's Queue CRD not served: the zero value).
	queue gang.QueueProblem
	// fit is the inventory's verdict on the whole gang.
	fit inventory.FitResult
	now time.Time
	// maxPods is the manager's --max-workload-pods; 0: its default.
	maxPods int
	// kueue is the job's Kueue Workload, when the job names a LocalQueue.
	kueue kueueObs
	// service is the job's headless Service, when the cache holds one the
	// job controls.
	service *corev1.Service
	// taken says which of the gang's pod names a stranger's pod holds
	// (asked while the attempt has no pod); "" when none does.
	taken string
	// refused is why the API server refuses the roles' pods (a dry run,
	// asked while the gang lacks pods), naming the fields; "" when it
	// admits them or was not asked.
	refused string
}

// decision is what a reconcile must do, computed purely from the job and
// what was observed.
type decision struct {
	status trainingv1alpha1.TrainingJobStatus
	// create are pods to create, in rank order, at most what one pass of
	// the executor creates (podset.PerPass, less the deletes); remove are
	// pods to delete.
	create, remove []*corev1.Pod
	// deferred counts the missing pods left for the next pass (not built).
	deferred int
	// podGroup is the PodGroup to ensure; removePodGroup: the job's
	// PodGroup must go.
	podGroup       *schedulingv1beta1.PodGroup
	removePodGroup bool
	// children are the other children to ensure: the headless Service;
	// removeService: the finished job's Service must go.
	children      []client.Object
	removeService bool
	// deleteJob: the TTL after finishing has passed.
	deleteJob bool
	// requeue is when to look again without an event (deadline, TTL).
	requeue time.Duration
	// events are the notable transitions to record.
	events []event
	// scheduledAfter is set when the gang became scheduled: how long it took.
	scheduledAfter time.Duration
	// restarted: this pass restarts the gang.
	restarted bool
}

// event is a notable transition, recorded on the job.
type event struct {
	warning     bool
	reason, msg string
}

// Reasons on the job's conditions.
const (
	ReasonCreated             = "Created"
	ReasonCreateFailed        = "CreateFailed"
	ReasonVolcanoNotInstalled = "VolcanoNotInstalled"
	ReasonGangPending         = "GangPending"
	ReasonGangInqueue         = "GangInqueue"
	ReasonGangScheduled       = "GangScheduled"
	ReasonPodsPending         = "PodsPending"
	ReasonNeverFits           = "NeverFits"
	ReasonNotEnoughGPUs       = "NotEnoughGPUs"
	ReasonPodsRunning         = "PodsRunning"
	ReasonWaitingForPods      = "WaitingForPods"
	ReasonRetryableFailure    = "RetryableFailure"
	ReasonPermanentFailure    = "PermanentFailure"
	ReasonBackoffLimit        = "BackoffLimitExceeded"
	ReasonDeadlineExceeded    = "DeadlineExceeded"
	ReasonMasterSucceeded     = "MasterSucceeded"
	ReasonSuspended           = "Suspended"
	ReasonResumed             = "Resumed"
	ReasonRestartDone         = "GangRestarted"
	ReasonTooManyPods         = "TooManyPods"
	ReasonInvalidSpec         = "InvalidSpec"
	ReasonNameConflict        = "NameConflict"
	ReasonQueuedInKueue       = "QueuedInKueue"
	ReasonEvictedByKueue      = "EvictedByKueue"
	// ReasonWorkloadDeactivated: the job's Kueue Workload was deactivated
	// by a person or by Kueue (its requeuing limit, its maximum execution
	// time), not for the job's suspension: only its reactivation resumes it.
	ReasonWorkloadDeactivated = "WorkloadDeactivated"
	// ReasonQueueNameMissing: the job names no LocalQueue, and the manager
	// runs no job outside Kueue (--kueue-manage-jobs-without-queue-name).
	ReasonQueueNameMissing = "QueueNameMissing"
	// ReasonQueueAnnotationIgnored is the Warning event of a job that
	// names its LocalQueue in Kueue's removed queue annotation.
	ReasonQueueAnnotationIgnored = "QueueAnnotationIgnored"
)

// conditions are the condition types the training reconciler writes.
var conditions = []string{
	trainingv1alpha1.ConditionCreated, trainingv1alpha1.ConditionScheduled, trainingv1alpha1.ConditionRunning,
	trainingv1alpha1.ConditionRestarting, trainingv1alpha1.ConditionSucceeded, trainingv1alpha1.ConditionFailed,
	trainingv1alpha1.ConditionSuspended, trainingv1alpha1.ConditionReady,
	trainingv1alpha1.ConditionReconciling, trainingv1alpha1.ConditionStalled,
}

// pass is one decision in the making: the job, what was observed, the pods
// sorted for the current attempt and the decision so far.
type pass struct {
	job *trainingv1alpha1.TrainingJob
	obs observed
	// defScheduler is the manager's gang scheduler; autoScheduler: its
	// auto chose the job's.
	defScheduler  trainingv1alpha1.GangScheduler
	autoScheduler bool
	pods          podView
	// hold: no pods are created, the gang waits for Volcano to admit it.
	hold bool
	d    decision
}

// set sets a condition of the pass's status.
func (p *pass) set(t string, s metav1.ConditionStatus, reason, msg string) {
	setCond(&p.d.status, t, s, reason, msg, p.job.Generation, p.obs.now)
}

// ready sets the Ready condition, set on every pass: its message also
// says when a queue move waits for the job's Kueue Workload to release its
// quota (queueMovePending).
func (p *pass) ready(s metav1.ConditionStatus, reason, msg string) {
	if note := queueMovePending(p); note != "" && !p.d.status.Finished() {
		msg += "; " + note
	}
	p.set(trainingv1alpha1.ConditionReady, s, reason, msg)
}

func (p *pass) event(warning bool, reason, msg string) {
	p.d.events = append(p.d.events, event{warning: warning, reason: reason, msg: msg})
}

// phases are decide's steps, in order; a step that returns true has
// completed the decision.
var phases = []func(*pass) bool{
	begin,
	finished,
	suspend,
	resume,
	sortPods,
	deadline,
	outcome,
	limit,
	invalid,
	conflict,
	volcano,
	neverFits,
	children,
	scale,
	schedule,
	status,
}

// decide is the training reconciler's pure core: from the job and what was
// observed, the next status and the changes to make. It looks only at the
// job's own pods (ownPods).
func decide(job *trainingv1alpha1.TrainingJob, obs observed, defScheduler trainingv1alpha1.GangScheduler) decision {
	obs.pods = ownPods(job, obs.pods)
	p := &pass{job: job, obs: obs, defScheduler: defScheduler, d: decision{status: *job.Status.DeepCopy()}}
	for _, phase := range phases {
		if phase(p) {
			break
		}
	}
	settle(&p.d.status, job.Generation, obs.now)
	return p.d
}

// begin fills what every status says: the generation seen, the scheduler
// (fixed once the gang is scheduled), the gang's size and GPUs, the start
// time, and a Scheduled condition.
func begin(p *pass) bool {
	st := &p.d.status
	st.ObservedGeneration = p.job.Generation
	if st.Scheduler == "" || !condTrue(st, trainingv1alpha1.ConditionScheduled) {
		st.Scheduler, p.autoScheduler = scheduler(p.job, p.defScheduler, p.obs.volcano)
	}
	st.Workers = p.job.Spec.Workers()
	st.GPUs, _ = gangGPUs(p.job)
	if st.StartTime == nil {
		t := metav1.NewTime(p.obs.now)
		st.StartTime = &t
	}
	if meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionScheduled) == nil {
		p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonPodsPending, "the gang has not been scheduled yet")
	}
	return false
}

// finished: a job that has ended only cleans up (finish).
func finished(p *pass) bool {
	if !p.d.status.Finished() {
		return false
	}
	finish(p)
	return true
}

// suspend: while runPolicy.suspend is set, or Kueue has not admitted the
// job (or evicted it), the gang's pods and PodGroup are deleted and the job
// says Suspended.
func suspend(p *pass) bool {
	// A job that cannot run as written and has no pod has nothing for
	// Kueue to hold: limit or invalid says why it is held.
	byKueue := !p.job.Spec.RunPolicy.Suspend && p.obs.kueue.holds() && (p.obs.kueue.cannotRun == "" || len(p.obs.pods) > 0)
	if !p.job.Spec.RunPolicy.Suspend && !byKueue {
		return false
	}
	st := &p.d.status
	for _, pod := range p.obs.pods {
		if pod.DeletionTimestamp == nil {
			p.d.remove = append(p.d.remove, pod)
		}
	}
	p.d.removePodGroup = true
	st.ReplicaStatuses = trainingv1alpha1.ReplicaStatuses{}
	st.State = trainingv1alpha1.StateSuspended
	reason, msg := ReasonSuspended, "runPolicy.suspend is true: the gang's pods and PodGroup are deleted until it is unset"
	if byKueue {
		reason, msg = kueueHold(p)
		if p.obs.kueue.queued {
			// Made while the job waits: a stranger's Service of its name
			// stops it (NameConflict) before its Workload takes quota.
			p.d.children = append(p.d.children, buildService(p.job, frameworks[p.job.Spec.Framework]))
		}
	} else if note := queueAnnotationIgnored(p); note != "" {
		msg += "; " + note
	} else if note := workloadSuspended(p); note != "" {
		msg += "; " + note
	}
	if c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionSuspended); c == nil || c.Status != metav1.ConditionTrue || c.Reason != reason {
		p.set(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, reason, msg)
		clearRestarting(p, reason, msg)
		p.event(false, reason, msg)
	}
	// The message follows (Kueue's word changes while the job waits, its
	// Workload goes and comes), as Scheduled's and Ready's do: no write of
	// its own.
	p.set(trainingv1alpha1.ConditionSuspended, metav1.ConditionTrue, reason, msg)
	p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, reason, msg)
	p.ready(metav1.ConditionFalse, reason, msg)
	return true
}

// kueueHold says why Kueue holds the job: its queue and Kueue's message
// (the quota it lacks), next to the inventory's word on the gang.
func kueueHold(p *pass) (reason, msg string) {
	k := &p.obs.kueue
	switch {
	case k.unnamed:
		reason, msg = ReasonQueueNameMissing, "the job names no Kueue LocalQueue (label "+kueueQueueLabel+
			", and no LocalQueue named default in its namespace) and Loom runs no job outside Kueue (--kueue-manage-jobs-without-queue-name): no pods are created until the label names one"
	case !k.served:
		// The CRD's installation wakes the job (heldJobs).
		return ReasonQueuedInKueue, "the job names Kueue LocalQueue " + p.job.Labels[kueueQueueLabel] + " but Kueue's Workload CRD is not installed: no pods are created until Kueue admits the job"
	case k.wl == nil && k.badQueue != "":
		reason, msg = ReasonInvalidSpec, "the job's "+kueueQueueLabel+" label "+strconv.Quote(p.job.Labels[kueueQueueLabel])+
			" is no LocalQueue's name ("+k.badQueue+"): Kueue cannot queue the job, and it gets no Workload until the label names a LocalQueue"
	case k.wl == nil && k.missingClass != "":
		// The class's creation wakes the job (heldOn).
		reason, msg = ReasonQueuedInKueue, "the job's priority names "+k.missingClass+", which does not exist: its Kueue Workload is made once it does"
	case k.deleting():
		reason, msg = ReasonQueuedInKueue, "its Kueue Workload "+k.wl.Name+" is being deleted: the gang is stopped, and a new Workload is queued once it is gone"
	case k.suspendedByLoom():
		reason, msg = ReasonQueuedInKueue, "the job resumed: its Kueue Workload "+k.wl.Name+" is reactivated, to be queued again"
	case !k.wl.Active():
		reason, msg = ReasonWorkloadDeactivated, "its Kueue Workload "+k.wl.Name+" is deactivated (spec.active is false"+evictedBy(k.wl)+
			"): no pods are created until it is reactivated by setting its spec.active to true"
	case k.wl.Evicted() != nil:
		reason, msg = ReasonEvictedByKueue, "suspended by Kueue: "+k.wl.Waiting()
	case k.wl.Uncovered() != "":
		reason, msg = ReasonQueuedInKueue, "Kueue's admission of Workload "+k.wl.Name+" covered part of the gang ("+k.wl.Uncovered()+
			"), and a gang runs whole: it is not started, and the admission is released for Kueue to admit it whole"
	case k.stale && k.wl.QuotaReserved():
		reason, msg = ReasonQueuedInKueue, "the job's pod sets (replicas or requests) changed since Kueue admitted Workload "+k.wl.Name+
			": the gang is stopped and the Workload replaced, to be admitted again"
	default:
		reason, msg = ReasonQueuedInKueue, "waiting for Kueue: "+k.wl.Waiting()
	}
	if f := p.obs.fit; f.Message != "" {
		msg += "; the cluster: " + f.Message
	}
	return reason, msg
}

// workloadSuspended says, for a queued job suspended by its runPolicy,
// what became of its Kueue Workload: deactivated, so that it holds no
// quota (syncWorkload), or deactivated by another party, which its
// resumption does not undo. "" for any other job.
func workloadSuspended(p *pass) string {
	k := &p.obs.kueue
	if !k.queued || k.wl == nil || k.deleting() || k.wl.Finished() {
		return ""
	}
	wl := k.wl
	switch {
	case !wl.Active() && !k.suspendedByLoom():
		return "its Kueue Workload " + wl.Name + " was deactivated by another party (spec.active is false" + evictedBy(wl) +
			"): it stays deactivated when the job resumes, until its spec.active is set to true"
	case wl.QuotaReserved():
		return "its Kueue Workload " + wl.Name + " is deactivated: Kueue evicts it, and its quota is released once the gang is gone"
	default:
		return "its Kueue Workload " + wl.Name + " is deactivated and holds no quota: it is queued again when the job resumes"
	}
}

// resume: a job leaving suspension starts a new attempt, afresh.
func resume(p *pass) bool {
	st := &p.d.status
	if !condTrue(st, trainingv1alpha1.ConditionSuspended) {
		return false
	}
	st.Attempt++
	t := metav1.NewTime(p.obs.now)
	st.StartTime = &t
	p.set(trainingv1alpha1.ConditionSuspended, metav1.ConditionFalse, ReasonResumed, "resumed: the gang starts afresh")
	p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonPodsPending, "the gang has not been scheduled yet")
	p.set(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, ReasonResumed, "resumed; waiting for the new gang")
	p.event(false, ReasonResumed, "resumed: starting a new gang")
	return false
}

// sortPods sorts the pods for the current attempt, removes those of older
// attempts and counts the current ones.
func sortPods(p *pass) bool {
	p.pods = viewPods(p.job, p.obs.pods, p.d.status.Attempt)
	p.d.remove = append(p.d.remove, p.pods.stale...)
	countPods(&p.d.status, p.pods)
	pinScheduler(p)
	return false
}

// pinScheduler keeps the scheduler the attempt's pods were built for while
// any of them exists, so that a gang is never split between two
// schedulers: Volcano installed under a job that --gang-scheduler=auto
// started pod by pod, or spec.gang.scheduler edited, takes effect with the
// next attempt (a restart, or a suspend and resume).
func pinScheduler(p *pass) {
	if len(p.pods.current) == 0 {
		return
	}
	built := trainingv1alpha1.GangNone
	for _, pod := range p.pods.current {
		// What gang.Join wrote, not a user's own annotation in the template.
		if pod.Spec.SchedulerName == gang.SchedulerName && pod.Annotations[gang.GroupNameAnnotation] == p.job.Name {
			built = trainingv1alpha1.GangVolcano
			break
		}
	}
	if st := &p.d.status; st.Scheduler != built {
		st.Scheduler = built
		p.autoScheduler = false
	}
}

// deadline fails a job past runPolicy.activeDeadlineSeconds, and otherwise
// asks to look again when it will be.
func deadline(p *pass) bool {
	dl := p.job.Spec.RunPolicy.ActiveDeadlineSeconds
	if dl == nil {
		return false
	}
	left := until(p.d.status.StartTime.Time, *dl, p.obs.now)
	if left <= 0 {
		fail(p, ReasonDeadlineExceeded, fmt.Sprintf("the job ran longer than runPolicy.activeDeadlineSeconds (%ds)", *dl))
		return true
	}
	p.d.requeue = left
	return false
}

// outcome ends or restarts the current attempt: the master's success, else
// the failures, a permanent one first.
func outcome(p *pass) bool {
	if m := p.pods.current[PodName(p.job.Name, trainingv1alpha1.RoleMaster, 0)]; m != nil && m.Status.Phase == corev1.PodSucceeded {
		succeed(p)
		return true
	}
	f := failures(p.job, p.pods)
	switch {
	case !f.failed:
		return false
	case !f.retryable:
		fail(p, ReasonPermanentFailure, f.why+" (a permanent failure under failurePolicy)")
	default:
		retry(p, f.why, f.disrupted)
	}
	return true
}

// limit holds a job that asks for more pods than the manager's
// --max-workload-pods: no pods, PodGroup or Service are created for it (pods
// left from before the limit was lowered are left alone), and Created,
// Scheduled and Ready say why. The count is Σ replicas in 64 bits.
func limit(p *pass) bool {
	total, most := totalPods(p.job), int64(maxPods(p.obs.maxPods))
	if total <= most {
		return false
	}
	st := &p.d.status
	st.State = trainingv1alpha1.StateHeld
	msg := fmt.Sprintf("the job asks for %d pods (1 master + %d workers), more than the manager allows one workload (--max-workload-pods=%d): no pods are created; "+
		"lower spec.replicaSpecs.worker.replicas (suspend the job to change it) or raise the limit", total, total-1, most)
	if c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionReady); c == nil || c.Reason != ReasonTooManyPods {
		p.event(true, ReasonTooManyPods, msg)
	}
	p.set(trainingv1alpha1.ConditionCreated, metav1.ConditionFalse, ReasonTooManyPods, msg)
	p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonTooManyPods, msg)
	p.ready(metav1.ConditionFalse, ReasonTooManyPods, msg)
	return true
}

// invalid holds a job whose pod templates carry metadata no pod may have
// (a label key or value, an annotation key or size the API server
// rejects), which the CRD's schema cannot check, or whose pods the API
// server refuses (obs.refused): no pods, PodGroup or Service are created,
// and Created, Scheduled and Ready name the fields, as a RayCluster's
// spec-validity condition does.
func invalid(p *pass) bool {
	errs := templateErrors(p.job)
	if len(errs) == 0 {
		return p.obs.refused != "" && hold(p, "the API server refuses the job's pods: "+p.obs.refused)
	}
	const most = 3
	var list []string
	for _, e := range errs[:min(len(errs), most)] {
		list = append(list, e.Error())
	}
	if len(errs) > most {
		list = append(list, fmt.Sprintf("and %d more", len(errs)-most))
	}
	return hold(p, "no pod can carry the template's metadata: "+strings.Join(list, "; "))
}

// hold holds the job InvalidSpec for why.
func hold(p *pass, why string) bool {
	st := &p.d.status
	st.State = trainingv1alpha1.StateHeld
	msg := why + ": no pods are created; suspend the job (runPolicy.suspend) to change its templates"
	if c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionReady); c == nil || c.Reason != ReasonInvalidSpec {
		p.event(true, ReasonInvalidSpec, msg)
	}
	p.set(trainingv1alpha1.ConditionCreated, metav1.ConditionFalse, ReasonInvalidSpec, msg)
	p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonInvalidSpec, msg)
	p.ready(metav1.ConditionFalse, ReasonInvalidSpec, msg)
	return true
}

// volcano holds a job whose scheduler is Volcano while Volcano is not
// installed; otherwise it says the gang is created.
func volcano(p *pass) bool {
	st := &p.d.status
	if st.Scheduler == trainingv1alpha1.GangVolcano && !p.obs.volcano {
		st.State = trainingv1alpha1.StateHeld
		msg := "spec.gang.scheduler is volcano (or the manager's --gang-scheduler default) but Volcano's PodGroup CRD (" + gang.CRDName + ") is not installed: no pods are created until it is; install Volcano, or set spec.gang.scheduler: none"
		p.set(trainingv1alpha1.ConditionCreated, metav1.ConditionFalse, ReasonVolcanoNotInstalled, msg)
		p.ready(metav1.ConditionFalse, ReasonVolcanoNotInstalled, msg)
		return true
	}
	msg := fmt.Sprintf("gang of %d pods (%d nvidia.com/gpu), scheduler %s", p.job.Spec.Pods(), st.GPUs, st.Scheduler)
	if p.autoScheduler && st.Scheduler == trainingv1alpha1.GangNone {
		msg += "; gang scheduling off: Volcano is not installed, so pods are scheduled one by one (the manager's --gang-scheduler=auto)"
	}
	if note := queueAnnotationIgnored(p); note != "" {
		msg += "; " + note
		if c := meta.FindStatusCondition(p.job.Status.Conditions, trainingv1alpha1.ConditionCreated); c == nil || !strings.Contains(c.Message, note) {
			p.event(true, ReasonQueueAnnotationIgnored, note)
		}
	}
	p.set(trainingv1alpha1.ConditionCreated, metav1.ConditionTrue, ReasonCreated, msg)
	return false
}

// neverFits fails, before any pod exists, a gang the inventory says this
// cluster can never hold, when gang.whenNeverFits says Fail.
func neverFits(p *pass) bool {
	if condTrue(&p.d.status, trainingv1alpha1.ConditionScheduled) || p.obs.fit.Verdict != inventory.Never ||
		p.job.Spec.Gang.WhenNeverFits != trainingv1alpha1.NeverFitsFail || len(p.pods.current) > 0 {
		return false
	}
	fail(p, ReasonNeverFits, p.obs.fit.Message+" (gang.whenNeverFits: Fail)")
	return true
}

// children wants the headless Service and, with Volcano, the attempt's
// PodGroup: pods are held until Volcano admits it (Inqueue), like Volcano's
// own job controller, so that a waiting gang holds no pods. An earlier
// attempt's PodGroup (its phase says nothing about this gang) is deleted
// first; the next pass creates the new one.
func children(p *pass) bool {
	p.d.children = append(p.d.children, buildService(p.job, frameworks[p.job.Spec.Framework]))
	st := &p.d.status
	if st.Scheduler != trainingv1alpha1.GangVolcano {
		// One left from when the job was for Volcano (spec.gang.scheduler
		// edited while it waited) would keep its quota in Volcano's queue.
		p.d.removePodGroup = p.obs.podGroup != nil
		return false
	}
	pg := p.obs.podGroup
	if pg != nil && pg.Labels[LabelAttempt] != strconv.Itoa(int(st.Attempt)) {
		p.d.removePodGroup = true
		p.obs.podGroup = nil
		p.hold = true
		return false
	}
	p.d.podGroup = buildPodGroup(p.job, st.Attempt)
	p.hold = !condTrue(st, trainingv1alpha1.ConditionScheduled) &&
		(pg == nil || pg.Status.Phase == "" || pg.Status.Phase == schedulingv1beta1.PodGroupPending)
	return false
}

// scale creates the gang's missing pods in rank order, unless held; a pod
// missing from a running gang breaks it instead: the gang restarts. Only the
// pods this pass can create are built (podset.PerPass, less the deletes);
// the others are counted as deferred, for the passes that follow.
func scale(p *pass) bool {
	// current holds only wanted pods, one a name: all there, none missing.
	if p.hold || int64(len(p.pods.current)) == totalPods(p.job) {
		return false
	}
	st := &p.d.status
	budget := max(podset.PerPass-len(p.d.remove), 0)
	for _, role := range roles {
		for i := range replicas(p.job, role) {
			name := PodName(p.job.Name, role, i)
			if p.pods.current[name] != nil {
				continue
			}
			// A pod of a running gang that is being deleted has left it
			// already: its node may never confirm the deletion (a lost
			// node keeps it Terminating), and the rest of the gang holds
			// its GPUs, hung in a collective, until then.
			// Its containers did not fail: the restart is a disruption.
			if condTrue(st, trainingv1alpha1.ConditionRunning) {
				retry(p, gone(p.pods.leaving[name], name), true)
				return true
			}
			if p.pods.occupied[name] {
				continue
			}
			if len(p.d.create) >= budget {
				p.d.deferred++
				continue
			}
			pod := buildPod(p.job, frameworks[p.job.Spec.Framework], role, i, st.Attempt, st.Scheduler)
			if pl, ok := p.obs.kueue.placement[role]; ok {
				pl.Apply(&pod.ObjectMeta, &pod.Spec)
			}
			p.d.create = append(p.d.create, pod)
		}
	}
	return false
}

func setCond(st *trainingv1alpha1.TrainingJobStatus, t string, s metav1.ConditionStatus, reason, msg string, gen int64, now time.Time) {
	apply.SetCondition(&st.Conditions, t, s, reason, msg, gen, now)
}

func condTrue(st *trainingv1alpha1.TrainingJobStatus, t string) bool {
	return meta.IsStatusConditionTrue(st.Conditions, t)
}
