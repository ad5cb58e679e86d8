package training

import (
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
)

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
	return index >= 0 && index < replicas(job, role) && isPodName(name, job.Name, role, index)
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

// cannotRun says why the job, as written, can never run (more pods than
// the manager allows, pod templates whose metadata no pod may carry or
// whose pods the API server refuses: the limit and invalid phases hold
// it); "" when nothing in the job does.
func cannotRun(job *trainingv1alpha1.TrainingJob, obs *observed) string {
	switch {
	case totalPods(job) > int64(maxPods(obs.maxPods)):
		return "it asks for more pods than --max-workload-pods allows"
	case len(templateErrors(job)) > 0:
		return "its pod templates carry metadata no pod may have"
	case obs.refused != "":
		return "the API server refuses its pods"
	case obs.taken != "":
		return "a pod of another owner holds one of its pods' names"
	}
	return ""
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

// templateErrors is what the API server would refuse in the roles' pod
// template labels and annotations, which every pod of the role copies.
func templateErrors(job *trainingv1alpha1.TrainingJob) field.ErrorList {
	var errs field.ErrorList
	for _, role := range roles {
		rs := replicaSpec(job, role)
		if rs == nil {
			continue
		}
		m := field.NewPath("spec", "replicaSpecs", string(role), "template", "metadata")
		errs = append(errs, metav1validation.ValidateLabels(rs.Template.Labels, m.Child("labels"))...)
		errs = append(errs, apivalidation.ValidateAnnotations(rs.Template.Annotations, m.Child("annotations"))...)
	}
	return errs
}

// conflictPoll is how often a job held on a pod name a stranger's pod
// holds looks again: that pod is not the job's, and its deletion does not
// wake it.
const conflictPoll = 5 * time.Second

// conflict holds a job one of whose pod names a stranger's pod holds
// (obs.taken), before anything of its attempt is made: no pod, Service,
// PodGroup or Kueue Workload, which Volcano would enqueue and Kueue admit,
// reserving a queue's resources for a gang that cannot start (and, without
// a gang scheduler, the pods ranked before the name would hold their GPUs).
// Created and Ready say NameConflict, naming the pod, until it is gone.
func conflict(p *pass) bool {
	if p.obs.taken == "" {
		return false
	}
	st := &p.d.status
	st.State = trainingv1alpha1.StateHeld
	p.d.removePodGroup = p.obs.podGroup != nil
	msg := p.obs.taken + "; nothing of the job is made until the name is free"
	if c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionReady); c == nil || c.Reason != ReasonNameConflict {
		p.event(true, ReasonNameConflict, msg)
	}
	p.set(trainingv1alpha1.ConditionCreated, metav1.ConditionFalse, ReasonNameConflict, msg)
	p.set(trainingv1alpha1.ConditionScheduled, metav1.ConditionFalse, ReasonNameConflict, msg)
	p.ready(metav1.ConditionFalse, ReasonNameConflict, msg)
	if p.d.requeue == 0 || p.d.requeue > conflictPoll {
		p.d.requeue = conflictPoll
	}
	return true
}
