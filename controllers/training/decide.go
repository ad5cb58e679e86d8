package training

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
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
}

// decision is what a reconcile must do, computed purely from the job and
// what was observed.
type decision struct {
	status trainingv1alpha1.TrainingJobStatus
	// create are pods to create, in rank order; remove are pods to delete.
	create, remove []*corev1.Pod
	// podGroup is the PodGroup to apply; removePodGroup deletes it.
	podGroup       *schedulingv1beta1.PodGroup
	removePodGroup bool
	// service: the headless Service must exist.
	service bool
	// deleteJob: the TTL after finishing has passed.
	deleteJob bool
	// requeue is when to look again without an event (deadline, TTL).
	requeue time.Duration
	// event is a notable transition to record, with its reason.
	eventReason, eventMessage string
	eventWarning              bool
	// scheduledAfter is set when the gang became scheduled: how long it took.
	scheduledAfter time.Duration
	restarted      bool
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
)

// podView sorts a job's pods for one pass.
type podView struct {
	// current are the pods of the current attempt that are not being
	// deleted, by name.
	current map[string]*corev1.Pod
	// occupied are names held by pods being deleted or of an older attempt:
	// a new pod of that name must wait.
	occupied map[string]bool
	// stale are pods of older attempts not yet being deleted.
	stale []*corev1.Pod
}

func viewPods(pods []*corev1.Pod, attempt int32) podView {
	v := podView{current: map[string]*corev1.Pod{}, occupied: map[string]bool{}}
	for _, p := range pods {
		_, _, a, ok := podIdentity(p)
		switch {
		case p.DeletionTimestamp != nil:
			v.occupied[p.Name] = true
		case !ok || a != attempt:
			v.occupied[p.Name] = true
			v.stale = append(v.stale, p)
		default:
			v.current[p.Name] = p
		}
	}
	return v
}

func setCond(st *trainingv1alpha1.TrainingJobStatus, t string, s metav1.ConditionStatus, reason, msg string, gen int64, now time.Time) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now)})
}

func condTrue(st *trainingv1alpha1.TrainingJobStatus, t string) bool {
	return meta.IsStatusConditionTrue(st.Conditions, t)
}

// decide is the training reconciler's pure core: from the job and what was
// observed, the next status and the changes to make.
func decide(job *trainingv1alpha1.TrainingJob, obs observed, defScheduler trainingv1alpha1.GangScheduler) decision {
	d := decision{status: *job.Status.DeepCopy()}
	st := &d.status
	gen, now := job.Generation, obs.now
	st.ObservedGeneration = gen
	if st.Scheduler == "" || !condTrue(st, trainingv1alpha1.ConditionScheduled) {
		st.Scheduler = scheduler(job, defScheduler)
	}
	st.Workers = job.Spec.Workers()
	st.GPUs, _ = gangGPUs(job)
	if st.StartTime == nil {
		t := metav1.NewTime(now)
		st.StartTime = &t
	}
	if meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionScheduled) == nil {
		setCond(st, trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonPodsPending, "the gang has not been scheduled yet", gen, now)
	}

	if st.Finished() {
		finish(job, obs, &d)
		return d
	}
	if job.Spec.RunPolicy.Suspend {
		suspend(job, obs, &d)
		return d
	}
	if condTrue(st, trainingv1alpha1.ConditionSuspended) {
		st.Attempt++
		t := metav1.NewTime(now)
		st.StartTime = &t
		setCond(st, trainingv1alpha1.ConditionSuspended, metav1.ConditionFalse, ReasonResumed, "resumed: the gang starts afresh", gen, now)
		setCond(st, trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonPodsPending, "the gang has not been scheduled yet", gen, now)
		setCond(st, trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, ReasonResumed, "resumed; waiting for the new gang", gen, now)
		d.eventReason, d.eventMessage = ReasonResumed, "resumed: starting a new gang"
	}

	v := viewPods(obs.pods, st.Attempt)
	d.remove = append(d.remove, v.stale...)
	countPods(st, v)

	if dl := job.Spec.RunPolicy.ActiveDeadlineSeconds; dl != nil {
		left := st.StartTime.Add(time.Duration(*dl) * time.Second).Sub(now)
		if left <= 0 {
			fail(job, obs, &d, ReasonDeadlineExceeded, fmt.Sprintf("the job ran longer than runPolicy.activeDeadlineSeconds (%ds)", *dl))
			return d
		}
		d.requeue = left
	}

	// Outcome of the current attempt: the master's success, else the
	// failures, a permanent one first.
	if m := v.current[PodName(job.Name, trainingv1alpha1.RoleMaster, 0)]; m != nil && m.Status.Phase == corev1.PodSucceeded {
		succeed(job, obs, &d)
		return d
	}
	if retryable, why, failed := failures(job, v, st); failed {
		if !retryable {
			fail(job, obs, &d, ReasonPermanentFailure, why+" (a permanent failure under failurePolicy)")
			return d
		}
		if st.Restarts >= job.Spec.BackoffLimit() {
			fail(job, obs, &d, ReasonBackoffLimit, fmt.Sprintf("%s; the gang was restarted %d times, runPolicy.backoffLimit is %d", why, st.Restarts, job.Spec.BackoffLimit()))
			return d
		}
		restart(job, obs, v, &d, why)
		return d
	}

	sched := st.Scheduler
	if sched == trainingv1alpha1.GangVolcano && !obs.volcano {
		st.State = trainingv1alpha1.StateHeld
		msg := "spec.gang.scheduler is volcano (or the manager's --gang-scheduler default) but Volcano's PodGroup CRD (" + gang.CRDName + ") is not installed: no pods are created until it is; install Volcano, or set spec.gang.scheduler: none"
		setCond(st, trainingv1alpha1.ConditionCreated, metav1.ConditionFalse, ReasonVolcanoNotInstalled, msg, gen, now)
		setReady(st, metav1.ConditionFalse, ReasonVolcanoNotInstalled, msg, gen, now)
		return d
	}
	setCond(st, trainingv1alpha1.ConditionCreated, metav1.ConditionTrue, ReasonCreated, fmt.Sprintf("gang of %d pods (%d nvidia.com/gpu), scheduler %s", job.Spec.Pods(), st.GPUs, sched), gen, now)

	scheduled := condTrue(st, trainingv1alpha1.ConditionScheduled)
	if !scheduled && obs.fit.Verdict == inventory.Never && job.Spec.Gang.WhenNeverFits == trainingv1alpha1.NeverFitsFail && len(v.current) == 0 {
		fail(job, obs, &d, ReasonNeverFits, obs.fit.Message+" (gang.whenNeverFits: Fail)")
		return d
	}

	d.service = true
	holdPods := false
	if sched == trainingv1alpha1.GangVolcano {
		if pg := obs.podGroup; pg != nil && pg.Labels[LabelAttempt] != strconv.Itoa(int(st.Attempt)) {
			// An earlier attempt's group: its phase says nothing about this
			// gang. Delete it; the next pass creates the new one.
			d.removePodGroup = true
			obs.podGroup = nil
			holdPods = true
		} else {
			d.podGroup = buildPodGroup(job, st.Attempt)
			// Like Volcano's own job controller: pods only once the group is
			// admitted (Inqueue), so that a waiting gang holds no pods.
			holdPods = !scheduled && (pg == nil || pg.Status.Phase == "" || pg.Status.Phase == schedulingv1beta1.PodGroupPending)
		}
	}
	if !holdPods {
		for _, role := range roles {
			for i := range replicas(job, role) {
				name := PodName(job.Name, role, i)
				if v.current[name] != nil || v.occupied[name] {
					continue
				}
				if condTrue(st, trainingv1alpha1.ConditionRunning) {
					// A pod of a running gang vanished: the gang is broken.
					why := fmt.Sprintf("pod %s disappeared (deleted, or its node was lost)", name)
					if st.Restarts >= job.Spec.BackoffLimit() {
						fail(job, obs, &d, ReasonBackoffLimit, fmt.Sprintf("%s; the gang was restarted %d times, runPolicy.backoffLimit is %d", why, st.Restarts, job.Spec.BackoffLimit()))
						return d
					}
					restart(job, obs, v, &d, why)
					return d
				}
				d.create = append(d.create, buildPod(job, frameworks[job.Spec.Framework], role, i, st.Attempt, sched))
			}
		}
	}

	schedule(job, obs, v, &d, holdPods)
	run(job, obs, v, &d)
	return d
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
func failures(job *trainingv1alpha1.TrainingJob, v podView, st *trainingv1alpha1.TrainingJobStatus) (retryable bool, why string, failed bool) {
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

// restart deletes the whole gang and starts the next attempt.
func restart(job *trainingv1alpha1.TrainingJob, obs observed, v podView, d *decision, why string) {
	st, gen, now := &d.status, job.Generation, obs.now
	st.Restarts++
	st.Attempt++
	st.State = trainingv1alpha1.StateRestarting
	msg := fmt.Sprintf("%s: restarting the whole gang (restart %d of at most %d)", why, st.Restarts, job.Spec.BackoffLimit())
	setCond(st, trainingv1alpha1.ConditionRestarting, metav1.ConditionTrue, ReasonRetryableFailure, msg, gen, now)
	setCond(st, trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, ReasonRetryableFailure, msg, gen, now)
	setCond(st, trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonPodsPending, "restarting: the new gang has not been scheduled yet", gen, now)
	setReady(st, metav1.ConditionFalse, ReasonRetryableFailure, msg, gen, now)
	for _, p := range v.current {
		d.remove = append(d.remove, p)
	}
	// The PodGroup goes too: Volcano admits the new gang afresh.
	d.removePodGroup = obs.podGroup != nil
	d.eventReason, d.eventMessage, d.eventWarning = ReasonRetryableFailure, msg, true
	d.restarted = true
	st.ReplicaStatuses = trainingv1alpha1.ReplicaStatuses{}
}

func succeed(job *trainingv1alpha1.TrainingJob, obs observed, d *decision) {
	st, gen, now := &d.status, job.Generation, obs.now
	st.State = trainingv1alpha1.StateSucceeded
	t := metav1.NewTime(now)
	st.CompletionTime = &t
	msg := fmt.Sprintf("the master exited 0 (attempt %d, %d restarts)", st.Attempt, st.Restarts)
	setCond(st, trainingv1alpha1.ConditionSucceeded, metav1.ConditionTrue, ReasonMasterSucceeded, msg, gen, now)
	setCond(st, trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, ReasonMasterSucceeded, msg, gen, now)
	clearRestarting(st, gen, now)
	setReady(st, metav1.ConditionTrue, ReasonMasterSucceeded, msg, gen, now)
	d.eventReason, d.eventMessage = ReasonMasterSucceeded, msg
	finish(job, obs, d)
}

func fail(job *trainingv1alpha1.TrainingJob, obs observed, d *decision, reason, msg string) {
	st, gen, now := &d.status, job.Generation, obs.now
	st.State = trainingv1alpha1.StateFailed
	t := metav1.NewTime(now)
	st.CompletionTime = &t
	setCond(st, trainingv1alpha1.ConditionFailed, metav1.ConditionTrue, reason, msg, gen, now)
	setCond(st, trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, reason, msg, gen, now)
	clearRestarting(st, gen, now)
	setReady(st, metav1.ConditionFalse, reason, msg, gen, now)
	d.eventReason, d.eventMessage, d.eventWarning = reason, msg, true
	finish(job, obs, d)
}

func clearRestarting(st *trainingv1alpha1.TrainingJobStatus, gen int64, now time.Time) {
	if condTrue(st, trainingv1alpha1.ConditionRestarting) {
		setCond(st, trainingv1alpha1.ConditionRestarting, metav1.ConditionFalse, "Finished", "the job has finished", gen, now)
	}
}

// finish cleans a finished job's pods per cleanPodPolicy, releases its
// PodGroup and applies the TTL.
func finish(job *trainingv1alpha1.TrainingJob, obs observed, d *decision) {
	st := &d.status
	v := viewPods(obs.pods, st.Attempt)
	countPods(st, v)
	d.remove = append(d.remove[:0], v.stale...)
	policy := job.Spec.CleanPodPolicy()
	for _, p := range v.current {
		done := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		if policy == trainingv1alpha1.CleanPodAll || (policy == trainingv1alpha1.CleanPodRunning && !done) {
			d.remove = append(d.remove, p)
		}
	}
	d.removePodGroup = true
	d.create, d.podGroup, d.requeue = nil, nil, 0
	if ttl := job.Spec.RunPolicy.TTLSecondsAfterFinished; ttl != nil && st.CompletionTime != nil {
		left := st.CompletionTime.Add(time.Duration(*ttl) * time.Second).Sub(obs.now)
		if left <= 0 {
			d.deleteJob = true
		} else {
			d.requeue = left
		}
	}
}

func suspend(job *trainingv1alpha1.TrainingJob, obs observed, d *decision) {
	st, gen, now := &d.status, job.Generation, obs.now
	for _, p := range obs.pods {
		if p.DeletionTimestamp == nil {
			d.remove = append(d.remove, p)
		}
	}
	d.removePodGroup = true
	st.ReplicaStatuses = trainingv1alpha1.ReplicaStatuses{}
	st.State = trainingv1alpha1.StateSuspended
	if !condTrue(st, trainingv1alpha1.ConditionSuspended) {
		msg := "runPolicy.suspend is true: the gang's pods and PodGroup are deleted until it is unset"
		setCond(st, trainingv1alpha1.ConditionSuspended, metav1.ConditionTrue, ReasonSuspended, msg, gen, now)
		setCond(st, trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, ReasonSuspended, msg, gen, now)
		setCond(st, trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonSuspended, msg, gen, now)
		clearRestarting(st, gen, now)
		setReady(st, metav1.ConditionFalse, ReasonSuspended, msg, gen, now)
		d.eventReason, d.eventMessage = ReasonSuspended, msg
	}
}

// schedule sets the Scheduled condition: Volcano's PodGroup phase, or every
// pod bound; with the scheduler's or Volcano's own words plus the
// inventory's when it is not.
func schedule(job *trainingv1alpha1.TrainingJob, obs observed, v podView, d *decision, held bool) {
	st, gen, now := &d.status, job.Generation, obs.now
	if condTrue(st, trainingv1alpha1.ConditionScheduled) {
		return // sticky for the attempt: pods finishing do not unschedule it
	}
	total := int(job.Spec.Pods())
	bound := 0
	var podMsg string
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
	pgPhase := schedulingv1beta1.PodGroupPhase("")
	if obs.podGroup != nil {
		pgPhase = obs.podGroup.Status.Phase
	}
	if bound == total || pgPhase == schedulingv1beta1.PodGroupRunning {
		setCond(st, trainingv1alpha1.ConditionScheduled, metav1.ConditionTrue, ReasonGangScheduled, fmt.Sprintf("all %d pods of the gang are placed", total), gen, now)
		start := job.CreationTimestamp.Time
		if c := meta.FindStatusCondition(job.Status.Conditions, trainingv1alpha1.ConditionScheduled); c != nil && st.Attempt > 0 {
			start = c.LastTransitionTime.Time
		}
		if !start.IsZero() {
			d.scheduledAfter = max(now.Sub(start), 0)
		}
		return
	}

	reason, parts := ReasonPodsPending, []string{}
	switch {
	case st.Scheduler == trainingv1alpha1.GangVolcano && pgPhase == schedulingv1beta1.PodGroupInqueue:
		reason = ReasonGangInqueue
		parts = append(parts, fmt.Sprintf("Volcano admitted the gang to queue %s; %d of %d pods placed", job.Spec.Queue(), bound, total))
	case st.Scheduler == trainingv1alpha1.GangVolcano:
		reason = ReasonGangPending
		msg := fmt.Sprintf("PodGroup %s waits for Volcano to admit it to queue %s", job.Name, job.Spec.Queue())
		if obs.podGroup != nil {
			for _, c := range obs.podGroup.Status.Conditions {
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
	switch obs.fit.Verdict {
	case inventory.Never:
		reason = ReasonNeverFits
		parts = append(parts, "inventory: "+obs.fit.Message)
	case inventory.NotNow:
		if reason != ReasonGangInqueue {
			reason = ReasonNotEnoughGPUs
		}
		parts = append(parts, "inventory: "+obs.fit.Message)
	}
	if held {
		parts = append(parts, "no pods are created until the gang is admitted")
	}
	setCond(st, trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, reason, strings.Join(parts, "; "), gen, now)
}

// run sets Running, the state and Ready from the current pods.
func run(job *trainingv1alpha1.TrainingJob, obs observed, v podView, d *decision) {
	st, gen, now := &d.status, job.Generation, obs.now
	total := int(job.Spec.Pods())
	running, masterRunning := 0, false
	for _, p := range v.current {
		role, _, _, _ := podIdentity(p)
		switch {
		case p.Status.Phase == corev1.PodRunning:
			running++
			if role == trainingv1alpha1.RoleMaster {
				masterRunning = true
			}
		case p.Status.Phase == corev1.PodSucceeded && role == trainingv1alpha1.RoleWorker:
			running++ // a worker that finished first still belongs to a running gang
		}
	}
	if running == total && masterRunning {
		if !condTrue(st, trainingv1alpha1.ConditionRunning) {
			setCond(st, trainingv1alpha1.ConditionRunning, metav1.ConditionTrue, ReasonPodsRunning, fmt.Sprintf("all %d pods run", total), gen, now)
		}
		if condTrue(st, trainingv1alpha1.ConditionRestarting) {
			setCond(st, trainingv1alpha1.ConditionRestarting, metav1.ConditionFalse, ReasonRestartDone, fmt.Sprintf("the gang runs again after restart %d", st.Restarts), gen, now)
		}
		st.State = trainingv1alpha1.StateRunning
		setReady(st, metav1.ConditionTrue, ReasonPodsRunning, fmt.Sprintf("all %d pods run", total), gen, now)
		return
	}
	if !condTrue(st, trainingv1alpha1.ConditionRunning) {
		setCond(st, trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, ReasonWaitingForPods, fmt.Sprintf("%d of %d pods run", running, total), gen, now)
	}
	st.State = trainingv1alpha1.StatePending
	if condTrue(st, trainingv1alpha1.ConditionRestarting) {
		st.State = trainingv1alpha1.StateRestarting
	}
	sc := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionScheduled)
	reason, msg := ReasonWaitingForPods, fmt.Sprintf("%d of %d pods run", running, total)
	if sc != nil && sc.Status != metav1.ConditionTrue {
		reason, msg = sc.Reason, sc.Message
	}
	setReady(st, metav1.ConditionFalse, reason, msg, gen, now)
}

func setReady(st *trainingv1alpha1.TrainingJobStatus, s metav1.ConditionStatus, reason, msg string, gen int64, now time.Time) {
	setCond(st, trainingv1alpha1.ConditionReady, s, reason, msg, gen, now)
}

func sortedPods(m map[string]*corev1.Pod) []*corev1.Pod {
	out := make([]*corev1.Pod, 0, len(m))
	for _, p := range m {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
