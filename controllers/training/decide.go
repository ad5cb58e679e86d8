package training

import (
	"errors"
	"fmt"
	"math"
	"sort"
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
	"github.com/loom-dev/loom/internal/manager"
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
	// fit is the inventory's verdict on the whole gang.
	fit inventory.FitResult
	now time.Time
	// maxPods is the manager's --max-workload-pods; 0: its default.
	maxPods int
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
	// children are the other children to ensure: the headless Service.
	children []client.Object
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
	ReasonNameConflict        = "NameConflict"
)

// conditions are the condition types the training reconciler writes.
var conditions = []string{
	trainingv1alpha1.ConditionCreated, trainingv1alpha1.ConditionScheduled, trainingv1alpha1.ConditionRunning,
	trainingv1alpha1.ConditionRestarting, trainingv1alpha1.ConditionSucceeded, trainingv1alpha1.ConditionFailed,
	trainingv1alpha1.ConditionSuspended, trainingv1alpha1.ConditionReady,
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

// ready sets the Ready condition.
func (p *pass) ready(s metav1.ConditionStatus, reason, msg string) {
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

// suspend: while runPolicy.suspend is set, the gang's pods and PodGroup are
// deleted and the job says Suspended.
func suspend(p *pass) bool {
	if !p.job.Spec.RunPolicy.Suspend {
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
	if !condTrue(st, trainingv1alpha1.ConditionSuspended) {
		msg := "runPolicy.suspend is true: the gang's pods and PodGroup are deleted until it is unset"
		p.set(trainingv1alpha1.ConditionSuspended, metav1.ConditionTrue, ReasonSuspended, msg)
		p.set(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, ReasonSuspended, msg)
		p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonSuspended, msg)
		clearRestarting(p)
		p.ready(metav1.ConditionFalse, ReasonSuspended, msg)
		p.event(false, ReasonSuspended, msg)
	}
	return true
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
	return false
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
	retryable, why, failed := failures(p.job, p.pods)
	switch {
	case !failed:
		return false
	case !retryable:
		fail(p, ReasonPermanentFailure, why+" (a permanent failure under failurePolicy)")
	default:
		retry(p, why)
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
	if p.hold {
		return false
	}
	st := &p.d.status
	budget := max(podset.PerPass-len(p.d.remove), 0)
	for _, role := range roles {
		for i := range replicas(p.job, role) {
			name := PodName(p.job.Name, role, i)
			if p.pods.current[name] != nil || p.pods.occupied[name] {
				continue
			}
			if condTrue(st, trainingv1alpha1.ConditionRunning) {
				retry(p, fmt.Sprintf("pod %s disappeared (deleted, or its node was lost)", name))
				return true
			}
			if len(p.d.create) >= budget {
				p.d.deferred++
				continue
			}
			p.d.create = append(p.d.create, buildPod(p.job, frameworks[p.job.Spec.Framework], role, i, st.Attempt, st.Scheduler))
		}
	}
	return false
}

// podView sorts a job's pods for one pass.
type podView struct {
	// current are the pods of the current attempt that are not being
	// deleted and that the gang wants (named for their role and index, the
	// index within the role's replicas), by name.
	current map[string]*corev1.Pod
	// occupied are names held by pods being deleted, of an older attempt or
	// not wanted: a new pod of that name must wait.
	occupied map[string]bool
	// stale are pods of older attempts, or not wanted, not yet being
	// deleted.
	stale []*corev1.Pod
}

func viewPods(job *trainingv1alpha1.TrainingJob, pods []*corev1.Pod, attempt int32) podView {
	v := podView{current: map[string]*corev1.Pod{}, occupied: map[string]bool{}}
	for _, p := range pods {
		role, index, a, ok := podIdentity(p)
		switch {
		case p.DeletionTimestamp != nil:
			v.occupied[p.Name] = true
		case !ok || a != attempt || !wanted(job, role, index, p.Name) || v.current[p.Name] != nil:
			v.occupied[p.Name] = true
			v.stale = append(v.stale, p)
		default:
			v.current[p.Name] = p
		}
	}
	return v
}

func setCond(st *trainingv1alpha1.TrainingJobStatus, t string, s metav1.ConditionStatus, reason, msg string, gen int64, now time.Time) {
	apply.SetCondition(&st.Conditions, t, s, reason, msg, gen, now)
}

func condTrue(st *trainingv1alpha1.TrainingJobStatus, t string) bool {
	return meta.IsStatusConditionTrue(st.Conditions, t)
}

// countPods fills the per-role counts of the current attempt.
func countPods(st *trainingv1alpha1.TrainingJobStatus, v podView) {
	st.ReplicaStatuses = trainingv1alpha1.ReplicaStatuses{}
	for _, p := range v.current {
		role, _, _, _ := podIdentity(p)
		rs := &st.ReplicaStatuses.Master
		if role == trainingv1alpha1.RoleWorker {
			rs = &st.ReplicaStatuses.Worker
		}
		switch p.Status.Phase {
		case corev1.PodSucceeded:
			rs.Succeeded++
		case corev1.PodFailed:
			rs.Failed++
		default:
			rs.Active++
		}
	}
}

// failures looks at the current attempt's failed pods: whether any failed,
// whether all failures are retryable, and why (the first permanent failure,
// else the first retryable one, by pod name).
func failures(job *trainingv1alpha1.TrainingJob, v podView) (retryable bool, why string, failed bool) {
	names := make([]string, 0, len(v.current))
	for n, p := range v.current {
		if p.Status.Phase == corev1.PodFailed {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return false, "", false
	}
	sort.Strings(names)
	var firstRetryable string
	for _, n := range names {
		r, w := classify(job, v.current[n])
		if !r {
			return false, w, true
		}
		if firstRetryable == "" {
			firstRetryable = w
		}
	}
	return true, firstRetryable, true
}

// disruptionReasons are pod status reasons of failures the pod did not
// cause.
var disruptionReasons = map[string]bool{"Evicted": true, "Preempting": true, "Preempted": true, "NodeLost": true, "Shutdown": true, "NodeShutdown": true, "Terminated": true, "UnexpectedAdmissionError": true, "OutOfgpu": true}

// classify says whether a failed pod's failure is retryable, and describes
// it.
func classify(job *trainingv1alpha1.TrainingJob, p *corev1.Pod) (bool, string) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return true, fmt.Sprintf("pod %s was disrupted (%s: %s)", p.Name, c.Reason, c.Message)
		}
	}
	if disruptionReasons[p.Status.Reason] {
		return true, fmt.Sprintf("pod %s failed: %s: %s", p.Name, p.Status.Reason, p.Status.Message)
	}
	for _, cs := range p.Status.ContainerStatuses {
		t := cs.State.Terminated
		if t == nil || t.ExitCode == 0 {
			continue
		}
		kind := "permanent"
		r := job.Spec.Retryable(t.ExitCode)
		if r {
			kind = "retryable"
		}
		detail := t.Reason
		if detail == "" {
			detail = "Error"
		}
		return r, fmt.Sprintf("pod %s: container %s exited with code %d (%s, %s)", p.Name, cs.Name, t.ExitCode, detail, kind)
	}
	msg := strings.TrimSpace(p.Status.Reason + " " + p.Status.Message)
	if msg == "" {
		msg = "no container exit code"
	}
	return true, fmt.Sprintf("pod %s failed: %s", p.Name, msg)
}

// retry restarts the gang after a retryable failure, or fails the job once
// runPolicy.backoffLimit restarts have been spent.
func retry(p *pass, why string) {
	st := &p.d.status
	if limit := p.job.Spec.BackoffLimit(); st.Restarts >= limit {
		fail(p, ReasonBackoffLimit, fmt.Sprintf("%s; the gang was restarted %d times, runPolicy.backoffLimit is %d", why, st.Restarts, limit))
		return
	}
	restart(p, why)
}

// restart deletes the whole gang and starts the next attempt.
func restart(p *pass, why string) {
	st := &p.d.status
	st.Restarts++
	st.Attempt++
	st.State = trainingv1alpha1.StateRestarting
	msg := fmt.Sprintf("%s: restarting the whole gang (restart %d of at most %d)", why, st.Restarts, p.job.Spec.BackoffLimit())
	p.set(trainingv1alpha1.ConditionRestarting, metav1.ConditionTrue, ReasonRetryableFailure, msg)
	p.set(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, ReasonRetryableFailure, msg)
	p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonPodsPending, "restarting: the new gang has not been scheduled yet")
	p.ready(metav1.ConditionFalse, ReasonRetryableFailure, msg)
	for _, pod := range p.pods.current {
		p.d.remove = append(p.d.remove, pod)
	}
	// The PodGroup goes too: Volcano admits the new gang afresh.
	p.d.removePodGroup = p.obs.podGroup != nil
	p.d.create, p.d.children, p.d.podGroup, p.d.deferred = nil, nil, nil, 0
	p.event(true, ReasonRetryableFailure, msg)
	p.d.restarted = true
	st.ReplicaStatuses = trainingv1alpha1.ReplicaStatuses{}
}

// succeed ends the job: the master exited 0.
func succeed(p *pass) {
	st := &p.d.status
	msg := fmt.Sprintf("the master exited 0 (attempt %d, %d restarts)", st.Attempt, st.Restarts)
	end(p, trainingv1alpha1.StateSucceeded, trainingv1alpha1.ConditionSucceeded, ReasonMasterSucceeded, msg)
}

// fail ends the job with a failure.
func fail(p *pass, reason, msg string) {
	end(p, trainingv1alpha1.StateFailed, trainingv1alpha1.ConditionFailed, reason, msg)
}

// end ends the job in state (Succeeded or Failed) with its condition true,
// Running false, Ready true only for a success and an event (a warning for
// a failure), then cleans up (finish).
func end(p *pass, state trainingv1alpha1.JobState, cond, reason, msg string) {
	st := &p.d.status
	st.State = state
	t := metav1.NewTime(p.obs.now)
	st.CompletionTime = &t
	ready := metav1.ConditionFalse
	if state == trainingv1alpha1.StateSucceeded {
		ready = metav1.ConditionTrue
	}
	p.set(cond, metav1.ConditionTrue, reason, msg)
	p.set(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, reason, msg)
	clearRestarting(p)
	p.ready(ready, reason, msg)
	p.event(ready == metav1.ConditionFalse, reason, msg)
	finish(p)
}

func clearRestarting(p *pass) {
	if condTrue(&p.d.status, trainingv1alpha1.ConditionRestarting) {
		p.set(trainingv1alpha1.ConditionRestarting, metav1.ConditionFalse, "Finished", "the job has finished")
	}
}

// finish cleans a finished job's pods per cleanPodPolicy, releases its
// PodGroup and applies the TTL.
func finish(p *pass) {
	st, d := &p.d.status, &p.d
	v := viewPods(p.job, p.obs.pods, st.Attempt)
	countPods(st, v)
	d.remove = append(d.remove[:0], v.stale...)
	policy := p.job.Spec.CleanPodPolicy()
	for _, pod := range v.current {
		done := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
		if policy == trainingv1alpha1.CleanPodAll || (policy == trainingv1alpha1.CleanPodRunning && !done) {
			d.remove = append(d.remove, pod)
		}
	}
	d.removePodGroup = true
	d.create, d.children, d.podGroup, d.requeue, d.deferred = nil, nil, nil, 0, 0
	if ttl := p.job.Spec.RunPolicy.TTLSecondsAfterFinished; ttl != nil && st.CompletionTime != nil {
		left := until(st.CompletionTime.Time, int64(*ttl), p.obs.now)
		if left <= 0 {
			d.deleteJob = true
		} else {
			d.requeue = left
		}
	}
}

// schedule sets the Scheduled condition: Volcano's PodGroup phase, or every
// pod bound; with the scheduler's or Volcano's own words plus the
// inventory's when it is not.
func schedule(p *pass) bool {
	st := &p.d.status
	if condTrue(st, trainingv1alpha1.ConditionScheduled) {
		return false // sticky for the attempt: pods finishing do not unschedule it
	}
	total := int(p.job.Spec.Pods())
	bound, podMsg := placed(p.pods)
	pgPhase := schedulingv1beta1.PodGroupPhase("")
	if p.obs.podGroup != nil {
		pgPhase = p.obs.podGroup.Status.Phase
	}
	if bound == total || pgPhase == schedulingv1beta1.PodGroupRunning {
		p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionTrue, ReasonGangScheduled, fmt.Sprintf("all %d pods of the gang are placed", total))
		start := p.job.CreationTimestamp.Time
		if c := meta.FindStatusCondition(p.job.Status.Conditions, trainingv1alpha1.ConditionScheduled); c != nil && st.Attempt > 0 {
			start = c.LastTransitionTime.Time
		}
		if !start.IsZero() {
			p.d.scheduledAfter = max(p.obs.now.Sub(start), 0)
		}
		return false
	}
	reason, parts := pending(p, pgPhase, bound, total, podMsg)
	p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, reason, strings.Join(parts, "; "))
	return false
}

// placed counts the current pods bound to a node, and quotes the first
// unbound pod's scheduler message.
func placed(v podView) (bound int, podMsg string) {
	for _, p := range sortedPods(v.current) {
		if p.Spec.NodeName != "" {
			bound++
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" && podMsg == "" {
				podMsg = fmt.Sprintf("pod %s: %s", p.Name, c.Message)
			}
		}
	}
	return bound, podMsg
}

// pending explains a gang not scheduled yet: the scheduler's words (Volcano's
// or the pods'), then the inventory's, then whether pods are held.
func pending(p *pass, pgPhase schedulingv1beta1.PodGroupPhase, bound, total int, podMsg string) (string, []string) {
	reason, parts := ReasonPodsPending, []string{}
	queue := p.job.Spec.Queue()
	switch {
	case p.d.status.Scheduler == trainingv1alpha1.GangVolcano && pgPhase == schedulingv1beta1.PodGroupInqueue:
		reason = ReasonGangInqueue
		parts = append(parts, fmt.Sprintf("Volcano admitted the gang to queue %s; %d of %d pods placed", queue, bound, total))
	case p.d.status.Scheduler == trainingv1alpha1.GangVolcano:
		reason = ReasonGangPending
		msg := fmt.Sprintf("PodGroup %s waits for Volcano to admit it to queue %s", p.job.Name, queue)
		if pg := p.obs.podGroup; pg != nil {
			for _, c := range pg.Status.Conditions {
				if c.Type == schedulingv1beta1.PodGroupUnschedulableType && c.Status == corev1.ConditionTrue {
					msg = fmt.Sprintf("Volcano: %s", strings.TrimSpace(c.Reason+": "+c.Message))
				}
			}
		}
		parts = append(parts, msg)
	default:
		parts = append(parts, fmt.Sprintf("%d of %d pods placed", bound, total))
		if podMsg != "" {
			parts = append(parts, podMsg)
		}
	}
	switch p.obs.fit.Verdict {
	case inventory.Never:
		reason = ReasonNeverFits
		parts = append(parts, "inventory: "+p.obs.fit.Message)
	case inventory.NotNow:
		if reason != ReasonGangInqueue {
			reason = ReasonNotEnoughGPUs
		}
		parts = append(parts, "inventory: "+p.obs.fit.Message)
	}
	if p.hold {
		parts = append(parts, "no pods are created until the gang is admitted")
	}
	return reason, parts
}

// status sets Running, the state and Ready from the current pods.
func status(p *pass) bool {
	st := &p.d.status
	total := p.job.Spec.Pods()
	running, masterRunning := runningPods(p.pods)
	if running == total && masterRunning {
		msg := fmt.Sprintf("all %d pods run", total)
		if !condTrue(st, trainingv1alpha1.ConditionRunning) {
			p.set(trainingv1alpha1.ConditionRunning, metav1.ConditionTrue, ReasonPodsRunning, msg)
		}
		if condTrue(st, trainingv1alpha1.ConditionRestarting) {
			p.set(trainingv1alpha1.ConditionRestarting, metav1.ConditionFalse, ReasonRestartDone, fmt.Sprintf("the gang runs again after restart %d", st.Restarts))
		}
		st.State = trainingv1alpha1.StateRunning
		p.ready(metav1.ConditionTrue, ReasonPodsRunning, msg)
		return false
	}
	msg := fmt.Sprintf("%d of %d pods run", running, total)
	if !condTrue(st, trainingv1alpha1.ConditionRunning) {
		p.set(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, ReasonWaitingForPods, msg)
	}
	st.State = trainingv1alpha1.StatePending
	if condTrue(st, trainingv1alpha1.ConditionRestarting) {
		st.State = trainingv1alpha1.StateRestarting
	}
	reason := ReasonWaitingForPods
	if sc := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionScheduled); sc != nil && sc.Status != metav1.ConditionTrue {
		reason, msg = sc.Reason, sc.Message
	}
	p.ready(metav1.ConditionFalse, reason, msg)
	return false
}

// runningPods counts the current pods that belong to a running gang (a
// worker that finished first still does), and whether the master runs.
func runningPods(v podView) (running int32, masterRunning bool) {
	for _, p := range v.current {
		role, _, _, _ := podIdentity(p)
		switch {
		case p.Status.Phase == corev1.PodRunning:
			running++
			masterRunning = masterRunning || role == trainingv1alpha1.RoleMaster
		case p.Status.Phase == corev1.PodSucceeded && role == trainingv1alpha1.RoleWorker:
			running++
		}
	}
	return running, masterRunning
}

// applied records on the status that applying the decision failed: what
// stops the job (a missing PriorityClass, a quota, an admission webhook) is
// said on the job, not only in the manager's log.
func applied(st *trainingv1alpha1.TrainingJobStatus, err error, gen int64, now time.Time) {
	if err == nil {
		return
	}
	msg, reason := podset.Message(err), ReasonCreateFailed
	if nameConflict(err) {
		reason = ReasonNameConflict
	}
	setCond(st, trainingv1alpha1.ConditionCreated, metav1.ConditionFalse, reason, msg, gen, now)
	setCond(st, trainingv1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg, gen, now)
}

// nameConflict: a child's name (a pod's, the Service's) is taken by an
// object the job does not control, which Loom leaves alone: a person must
// rename one of them. A pod of the job's earlier attempt still terminating
// is no such conflict: it goes by itself.
func nameConflict(err error) bool {
	var c *podset.ConflictError
	if errors.As(err, &c) {
		return !c.EarlierAttempt
	}
	return apply.IsForeign(err)
}

// urgent: the decision records a restart, an end, a new attempt (a
// resumption) or a new state, which is written before anything else, so
// that a crash between the two never loses it, and so that a decision from
// a stale copy of the job fails its guarded write before it deletes a pod.
func urgent(job *trainingv1alpha1.TrainingJob, d *decision) bool {
	return d.restarted || (d.status.Finished() && !job.Status.Finished()) || d.status.State != job.Status.State ||
		d.status.Attempt != job.Status.Attempt
}

// countsOnly: the new status differs from the old only in counts and
// condition messages (no state, condition status or reason changes).
func countsOnly(old, st *trainingv1alpha1.TrainingJobStatus) bool {
	return old.State == st.State && old.Attempt == st.Attempt && old.Restarts == st.Restarts &&
		old.ObservedGeneration == st.ObservedGeneration && apply.SameConditions(old.Conditions, st.Conditions)
}

func sortedPods(m map[string]*corev1.Pod) []*corev1.Pod {
	out := make([]*corev1.Pod, 0, len(m))
	for _, p := range m {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ownPods keeps the pods that are the job's: in its namespace, labelled
// with its name and controlled by it. The executor lists only those; decide
// holds to it too, so that no decision deletes or counts a pod of another
// job or of a user.
func ownPods(job *trainingv1alpha1.TrainingJob, pods []*corev1.Pod) []*corev1.Pod {
	out := make([]*corev1.Pod, 0, len(pods))
	for _, p := range pods {
		if p != nil && p.Namespace == job.Namespace && p.Labels[LabelJobName] == job.Name && metav1.IsControlledBy(p, job) {
			out = append(out, p)
		}
	}
	return out
}

// wanted: the gang has a pod of this role and index, and this is its name.
func wanted(job *trainingv1alpha1.TrainingJob, role trainingv1alpha1.Role, index int32, name string) bool {
	return index >= 0 && index < replicas(job, role) && name == PodName(job.Name, role, index)
}

// totalPods is the job's Σ replicas, in 64 bits: a hostile replica count
// cannot overflow it.
func totalPods(job *trainingv1alpha1.TrainingJob) int64 {
	var n int64
	for _, role := range roles {
		n += int64(replicas(job, role))
	}
	return n
}

// maxPods is the limit in effect: the manager's, or its default when unset.
func maxPods(n int) int {
	if n <= 0 {
		return manager.DefaultMaxWorkloadPods
	}
	return n
}

// maxSeconds is the most whole seconds a time.Duration holds (about 292
// years).
const maxSeconds = math.MaxInt64 / int64(time.Second)

// seconds is n seconds as a duration, saturated rather than overflowing,
// and never negative.
func seconds(n int64) time.Duration {
	switch {
	case n <= 0:
		return 0
	case n > maxSeconds:
		return math.MaxInt64
	}
	return time.Duration(n) * time.Second
}

// until is how long from now until n seconds after start (a deadline, a
// TTL), saturated: never an overflow that makes a far deadline look passed.
// Past what a duration holds it counts in whole seconds (an API time's Unix
// seconds are far from overflowing).
func until(start time.Time, n int64, now time.Time) time.Duration {
	if n <= maxSeconds {
		return start.Add(seconds(n)).Sub(now)
	}
	elapsed := now.Unix() - start.Unix()
	if elapsed <= 0 { // a start ahead of this clock (another replica's)
		return math.MaxInt64
	}
	return seconds(n - elapsed)
}
