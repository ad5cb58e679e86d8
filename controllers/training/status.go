package training

import (
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/podset"
)

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
		msg := fmt.Sprintf("all %d pods of the gang are placed", total)
		if adm := p.obs.kueue.wl.AdmittedMessage(); p.obs.kueue.queued && adm != "" {
			msg = adm + "; " + msg
		}
		p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionTrue, ReasonGangScheduled, msg)
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
	if msg := p.obs.kueue.wl.AdmittedMessage(); p.obs.kueue.queued && msg != "" {
		parts = append([]string{msg}, parts...)
	}
	p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, reason, strings.Join(parts, "; "))
	return false
}

// placed counts the current pods bound to a node, and quotes the scheduler's
// message on the first unbound pod, by name, that has one.
func placed(v podView) (bound int, podMsg string) {
	var first *corev1.Pod
	var msg string
	for _, p := range v.current {
		if p.Spec.NodeName != "" {
			bound++
			continue
		}
		if first != nil && first.Name < p.Name {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
				first, msg = p, c.Message
				break
			}
		}
	}
	if first != nil {
		podMsg = fmt.Sprintf("pod %s: %s", first.Name, msg)
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
		if _, why := gang.Unschedulable(p.obs.podGroup); why != "" && bound < total {
			parts = append(parts, "Volcano: "+why)
		} else if podMsg != "" {
			parts = append(parts, podMsg)
		}
	case p.d.status.Scheduler == trainingv1alpha1.GangVolcano && p.obs.queue.Reason != "":
		reason = p.obs.queue.Reason
		parts = append(parts, p.obs.queue.Message)
	case p.d.status.Scheduler == trainingv1alpha1.GangVolcano:
		reason = ReasonGangPending
		msg := fmt.Sprintf("PodGroup %s waits for Volcano to admit it to queue %s", p.job.Name, queue)
		if _, why := gang.Unschedulable(p.obs.podGroup); why != "" {
			msg = "Volcano: " + why
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
		if reason == ReasonGangPending || reason == ReasonPodsPending {
			reason = ReasonNotEnoughGPUs
		}
		parts = append(parts, "inventory: "+p.obs.fit.Message)
	}
	if p.hold {
		parts = append(parts, "no pods are created until the gang is admitted")
	}
	if w := terminating(p); w != "" {
		parts = append(parts, w)
	}
	return reason, parts
}

// terminating names the first pod, by name, that the gang wants but cannot
// create yet: its name is held by a pod of an earlier attempt still being
// deleted on its node, which a lost node never ends.
func terminating(p *pass) string {
	var first *corev1.Pod
	for name, pod := range p.pods.leaving {
		role, index, _, ok := podIdentity(pod)
		if !ok || pod.Spec.NodeName == "" || p.pods.current[name] != nil || !wanted(p.job, role, index, name) || (first != nil && first.Name < name) {
			continue
		}
		first = pod
	}
	if first == nil {
		return ""
	}
	return fmt.Sprintf("pod %s of attempt %s is still being deleted (since %s, on node %s): the new one waits for it; if the node is lost, force-delete it (kubectl delete pod -n %s %s --grace-period=0 --force)",
		first.Name, first.Labels[LabelAttempt], first.DeletionTimestamp.UTC().Format(time.RFC3339), first.Spec.NodeName, first.Namespace, first.Name)
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
	if why := notStarting(p.pods); why != "" {
		msg += "; " + why
	}
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

// notStarting quotes, for the first pod by name that is held before it
// runs, why: a container waiting for another reason than its creation (an
// image that cannot be pulled, a Secret or ConfigMap that is missing),
// which never ends by itself and which no restart cures, or the
// scheduler's word on a pod not placed (a partial gang's pods, which
// Volcano places after the gang is scheduled).
func notStarting(v podView) string {
	var first *corev1.Pod
	var why string
	for _, p := range v.current {
		if p.Status.Phase != corev1.PodPending || (first != nil && first.Name < p.Name) {
			continue
		}
		if w := podset.WaitingWhy(p); w != "" {
			first, why = p, w
		}
	}
	if first == nil {
		return ""
	}
	return fmt.Sprintf("pod %s: %s", first.Name, why)
}

// runningPods counts the current pods that belong to a running gang (a
// worker that finished first still does), and whether the master runs.
func runningPods(v podView) (running int32, masterRunning bool) {
	for _, p := range v.current {
		role := podRole(p)
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
	settle(st, gen, now)
}

// nameConflict: a child's name (a pod's, the Service's) is taken by an
// object the job does not control, which Loom leaves alone: a person must
// rename one of them. A pod of the job's earlier attempt still terminating
// is no such conflict: it goes by itself.
func nameConflict(err error) bool {
	var c *podset.ConflictError
	if errors.As(err, &c) {
		return c.Stranger()
	}
	return apply.IsForeign(err)
}

// urgent: the decision records a restart, an end, a new attempt (a
// resumption) or a new state, which is written before anything else, so
// that a crash between the two never loses it, and so that a decision from
// a stale copy of the job fails its guarded write before it deletes a pod.
// A job's first pass is the exception when it deletes nothing: a crash
// before its one status write loses nothing the next pass does not work
// out again (only status.startTime is then taken at that pass), and the
// write would hold up the gang's first pod by a round trip.
func urgent(job *trainingv1alpha1.TrainingJob, d *decision) bool {
	if job.Status.State == "" && len(d.remove) == 0 && !d.restarted && !d.status.Finished() {
		return false
	}
	return d.restarted || (d.status.Finished() && !job.Status.Finished()) || d.status.State != job.Status.State ||
		d.status.Attempt != job.Status.Attempt
}

// countsOnly: the new status differs from the old only in counts and
// condition messages (no state, condition status or reason changes).
func countsOnly(old, st *trainingv1alpha1.TrainingJobStatus) bool {
	return old.State == st.State && old.Attempt == st.Attempt && old.Restarts == st.Restarts &&
		old.ObservedGeneration == st.ObservedGeneration && apply.SameConditions(old.Conditions, st.Conditions)
}

// stalledReasons are Ready's reasons that only a person can clear: a job
// over the manager's pod limit, a name taken by an object the job does not
// control, a gang for Volcano where Volcano is not installed, a Kueue
// Workload deactivated by a person or by Kueue, a job naming no LocalQueue
// where every job must.
var stalledReasons = map[string]bool{ReasonTooManyPods: true, ReasonInvalidSpec: true, ReasonNameConflict: true, ReasonVolcanoNotInstalled: true,
	ReasonWorkloadDeactivated: true, ReasonQueueNameMissing: true}

// settle sets kstatus's Reconciling and Stalled from the state and Ready,
// so that kstatus reads a pending, restarting or queued job InProgress, a
// running or succeeded one Current and a failed or refused one Failed.
// A job suspended by its own runPolicy.suspend is neither: it has what it
// asked for, and Ready False says it does not run.
func settle(st *trainingv1alpha1.TrainingJobStatus, gen int64, now time.Time) {
	reason, msg := "Unknown", "the job has not been looked at yet"
	if c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionReady); c != nil {
		reason, msg = c.Reason, c.Message
	}
	reconciling, stalled := metav1.ConditionFalse, metav1.ConditionFalse
	switch {
	case st.State == trainingv1alpha1.StateFailed:
		stalled = metav1.ConditionTrue
		if c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionFailed); c != nil {
			reason, msg = c.Reason, c.Message
		}
	case st.State == trainingv1alpha1.StateSucceeded:
		reason, msg = ReasonMasterSucceeded, "the job has succeeded"
	case stalledReasons[reason]:
		stalled = metav1.ConditionTrue
	case condTrue(st, trainingv1alpha1.ConditionReady):
		msg = "the gang runs"
	case st.State == trainingv1alpha1.StateSuspended && reason == ReasonSuspended:
		msg = "the job is suspended: it has no pods until runPolicy.suspend is unset"
	default:
		reconciling = metav1.ConditionTrue
	}
	rmsg, smsg := "nothing left to do", "nothing in the way"
	if reconciling == metav1.ConditionTrue {
		rmsg = msg
	} else if stalled == metav1.ConditionTrue {
		smsg = msg
	}
	setCond(st, trainingv1alpha1.ConditionReconciling, reconciling, reason, rmsg, gen, now)
	setCond(st, trainingv1alpha1.ConditionStalled, stalled, reason, smsg, gen, now)
}
