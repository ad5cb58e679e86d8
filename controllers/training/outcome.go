package training

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
)

// failure is what the current attempt's failed pods say: whether any
// failed, whether every failure is retryable, whether one was a
// disruption, and why (the first permanent failure, else the first
// retryable one, by pod name).
type failure struct {
	failed, retryable, disrupted bool
	why                          string
}

// failures looks at the current attempt's failed pods. A disruption (a
// failed pod with the DisruptionTarget condition, or a pod of the attempt
// being deleted with it) makes the restart a disruption even beside a
// permanent failure: when one rank is preempted or evicted, the others'
// collectives break and they exit with codes failurePolicy may call
// permanent, and the job must not fail for that. Otherwise the first
// permanent failure wins, then the first retryable one, by pod name.
func failures(job *trainingv1alpha1.TrainingJob, v podView) failure {
	names := make([]string, 0, len(v.current))
	for n, p := range v.current {
		if p.Status.Phase == corev1.PodFailed {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return failure{}
	}
	sort.Strings(names)
	var disrupted, permanent, first failure
	for _, n := range names {
		switch c := classify(job, v.current[n]); {
		case c.disrupted:
			if !disrupted.failed {
				disrupted = c
			}
		case !c.retryable:
			if !permanent.failed {
				permanent = c
			}
		case !first.failed:
			first = c
		}
	}
	if !disrupted.failed && v.disrupted != nil {
		disrupted = failure{failed: true, retryable: true, disrupted: true, why: gone(v.disrupted, v.disrupted.Name)}
	}
	switch {
	case disrupted.failed && permanent.failed:
		disrupted.why += "; " + permanent.why + " (not taken as a permanent failure: it most likely follows from the disruption)"
		return disrupted
	case disrupted.failed:
		return disrupted
	case permanent.failed:
		return permanent
	}
	return first
}

// disruptionReasons are pod status reasons of failures the pod did not
// cause.
var disruptionReasons = map[string]bool{"Evicted": true, "Preempting": true, "Preempted": true, "NodeLost": true, "Shutdown": true, "NodeShutdown": true, "Terminated": true, "UnexpectedAdmissionError": true, "OutOfgpu": true}

// classify says whether a failed pod's failure is retryable, whether it
// was a disruption (the DisruptionTarget condition the API server, the
// scheduler, the taint manager, the pod garbage collector and the kubelet's
// node-pressure eviction set: what batch/v1 Job's podFailurePolicy matches
// to ignore a failure), and describes it.
func classify(job *trainingv1alpha1.TrainingJob, p *corev1.Pod) failure {
	if c := disruption(p); c != nil {
		return failure{failed: true, retryable: true, disrupted: true, why: fmt.Sprintf("pod %s was disrupted (%s: %s)", p.Name, c.Reason, c.Message)}
	}
	if disruptionReasons[p.Status.Reason] {
		return failure{failed: true, retryable: true, why: fmt.Sprintf("pod %s failed: %s: %s", p.Name, p.Status.Reason, p.Status.Message)}
	}
	// The containers first, then the init containers (a pod that failed
	// in its init never started its containers). Sidecars (init containers
	// that restart always) are left out: they are stopped when the pod
	// ends, and their exit code says nothing about the job.
	statuses := slices.Clone(p.Status.ContainerStatuses)
	for _, cs := range p.Status.InitContainerStatuses {
		if !sidecar(p, cs.Name) {
			statuses = append(statuses, cs)
		}
	}
	// A permanent exit code in any container fails the pod for good,
	// whichever container the kubelet lists first (by name).
	var retryable *failure
	for _, cs := range statuses {
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
		f := failure{failed: true, retryable: r, why: fmt.Sprintf("pod %s: container %s exited with code %d (%s, %s)", p.Name, cs.Name, t.ExitCode, detail, kind)}
		if !r {
			return f
		}
		if retryable == nil {
			retryable = &f
		}
	}
	if retryable != nil {
		return *retryable
	}
	msg := strings.TrimSpace(p.Status.Reason + " " + p.Status.Message)
	if msg == "" {
		msg = "no container exit code"
	}
	return failure{failed: true, retryable: true, why: fmt.Sprintf("pod %s failed: %s", p.Name, msg)}
}

// disruption is the pod's DisruptionTarget condition while it is True.
func disruption(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if c := &p.Status.Conditions[i]; c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

// sidecar: the pod's init container name restarts always (a sidecar).
func sidecar(p *corev1.Pod, name string) bool {
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == name {
			return inventory.Sidecar(&p.Spec.InitContainers[i])
		}
	}
	return false
}

// retry restarts the gang after a retryable failure, or fails the job once
// runPolicy.backoffLimit restarts for failures have been spent. A
// disruption (disrupted) restarts it whatever the count, as batch/v1 Job's
// podFailurePolicy with DisruptionTarget: Ignore and Kubeflow's Training
// Operator (which counts only failures) do: a job preempted four times
// with backoffLimit 3 has not failed. activeDeadlineSeconds bounds a job
// that is disrupted for ever.
func retry(p *pass, why string, disrupted bool) {
	st := &p.d.status
	if limit, failed := p.job.Spec.BackoffLimit(), st.Restarts-st.Disruptions; !disrupted && failed >= limit {
		fail(p, ReasonBackoffLimit, fmt.Sprintf("%s; the gang was restarted %d times for failures (and %d for disruptions), runPolicy.backoffLimit is %d", why, failed, st.Disruptions, limit))
		return
	}
	restart(p, why, disrupted)
}

// restart deletes the whole gang and starts the next attempt.
func restart(p *pass, why string, disrupted bool) {
	st := &p.d.status
	st.Restarts++
	st.Attempt++
	st.State = trainingv1alpha1.StateRestarting
	msg := fmt.Sprintf("%s: restarting the whole gang (restart %d for a failure, of at most %d)", why, st.Restarts-st.Disruptions, p.job.Spec.BackoffLimit())
	if disrupted {
		st.Disruptions++
		msg = fmt.Sprintf("%s: restarting the whole gang (disruption %d, not counted against runPolicy.backoffLimit)", why, st.Disruptions)
	}
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
	clearRestarting(p, "Finished", "the job has finished")
	p.ready(ready, reason, msg)
	p.event(ready == metav1.ConditionFalse, reason, msg)
	finish(p)
}

// clearRestarting ends a restart in progress, saying why: the job has
// finished, or it is suspended.
func clearRestarting(p *pass, reason, msg string) {
	if condTrue(&p.d.status, trainingv1alpha1.ConditionRestarting) {
		p.set(trainingv1alpha1.ConditionRestarting, metav1.ConditionFalse, reason, msg)
	}
}

// finish cleans a finished job's pods per cleanPodPolicy, releases its
// PodGroup and applies the TTL. The Service goes with the pods, unless
// cleanPodPolicy is None (the Training Operator deletes each pod's Service
// with the pod): no endpoint is left to a finished pod, and none to a
// deleted one. A pass writes only while the cache still shows the Service.
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
	d.removeService = policy != trainingv1alpha1.CleanPodNone && p.obs.service != nil && p.obs.service.DeletionTimestamp == nil
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
