package training

import (
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/podset"
	"github.com/loom-dev/loom/internal/testenv"
)

// kstatusOf is what cli-utils' kstatus (Helm's --wait, Flux) reads from
// the job.
func kstatusOf(t *testing.T, job *trainingv1alpha1.TrainingJob) kstatus.Status {
	return testenv.KStatus(t, job, trainingv1alpha1.GroupVersion.WithKind("TrainingJob"))
}

// kstatus reads a TrainingJob in each phase as a person would: waiting or
// restarting is InProgress, running and succeeded are Current, failed and
// refused are Failed, and a spec Loom has not seen yet is InProgress.
func TestKstatus(t *testing.T) {
	now := time.Now()
	never := inventory.FitResult{Verdict: inventory.Never, Message: "needs 16 GPUs per pod, none with more than 8"}
	tests := []struct {
		name  string
		setup func(job *trainingv1alpha1.TrainingJob, obs *observed)
		want  kstatus.Status
	}{
		{"pending: pods not placed", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			for _, p := range obs.pods {
				p.Spec.NodeName, p.Status.Phase = "", corev1.PodPending
			}
		}, kstatus.InProgressStatus},
		{"running", func(*trainingv1alpha1.TrainingJob, *observed) {}, kstatus.CurrentStatus},
		{"restarting", func(_ *trainingv1alpha1.TrainingJob, obs *observed) { obs.pods = obs.pods[:1] }, kstatus.InProgressStatus},
		{"succeeded", func(_ *trainingv1alpha1.TrainingJob, obs *observed) {
			obs.pods[0].Status.Phase = corev1.PodSucceeded
		}, kstatus.CurrentStatus},
		{"failed", func(_ *trainingv1alpha1.TrainingJob, obs *observed) {
			obs.pods[0].Status.Phase = corev1.PodFailed
			obs.pods[0].Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}
		}, kstatus.FailedStatus},
		{"never fits, whenNeverFits Fail", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Status = trainingv1alpha1.TrainingJobStatus{}
			job.Spec.Gang.WhenNeverFits = trainingv1alpha1.NeverFitsFail
			obs.pods, obs.fit = nil, never
		}, kstatus.FailedStatus},
		{"never fits, waiting", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Status = trainingv1alpha1.TrainingJobStatus{}
			obs.pods, obs.fit = nil, never
		}, kstatus.InProgressStatus},
		{"too many pods", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Status = trainingv1alpha1.TrainingJobStatus{}
			obs.pods, obs.maxPods = nil, 1
		}, kstatus.FailedStatus},
		{"volcano missing", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Status = trainingv1alpha1.TrainingJobStatus{}
			job.Spec.Gang.Scheduler = trainingv1alpha1.GangVolcano
			obs.pods = nil
		}, kstatus.FailedStatus},
		{"queued in Kueue", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Labels = map[string]string{kueueQueueLabel: "team"}
			obs.kueue = kueueObs{queued: true}
		}, kstatus.InProgressStatus},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job, pods := runningGang(t, now)
			job.Generation = 3
			obs := observed{pods: pods, now: now, fit: inventory.FitResult{Verdict: inventory.FitsNow}}
			tt.setup(job, &obs)
			d := decide(job, obs, trainingv1alpha1.GangNone)
			job.Status = d.status
			if got := kstatusOf(t, job); got != tt.want {
				t.Fatalf("kstatus %s, want %s (state %s, conditions %+v)", got, tt.want, d.status.State, d.status.Conditions)
			}
			// A spec newer than the status is never Current nor Failed.
			job.Generation++
			if got := kstatusOf(t, job); got != kstatus.InProgressStatus {
				t.Fatalf("kstatus of an unobserved generation %s, want InProgress", got)
			}
		})
	}
}

// A failed apply: a quota is retried (InProgress), a name taken by
// another object needs a person (Failed).
func TestKstatusApplied(t *testing.T) {
	now := time.Now()
	job, _ := runningGang(t, now)
	st := job.Status.DeepCopy()
	applied(st, errors.New(`pods "j-master-0" is forbidden: exceeded quota`), job.Generation, now)
	job.Status = *st
	if got := kstatusOf(t, job); got != kstatus.InProgressStatus {
		t.Fatalf("after a quota error: %s, want InProgress", got)
	}
	applied(st, fmt.Errorf("creating pod j-worker-0: %w", &podset.ConflictError{Namespace: "ns", Pod: "j-worker-0", Owner: "j"}), job.Generation, now)
	job.Status = *st
	if got := kstatusOf(t, job); got != kstatus.FailedStatus {
		t.Fatalf("after a name conflict: %s, want Failed", got)
	}
}
