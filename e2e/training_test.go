package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

const trainingPool = "loom.dev/e2e-pool"

// simJob is a 1 master + workers job on the training pool whose pods end as
// the sim.loom.dev annotations say (e2e/framework/sim-stages.yaml).
func simJob(ns, name string, workers int32, master, worker map[string]string) *trainingv1alpha1.TrainingJob {
	tmpl := func(ann map[string]string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: ann},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{trainingPool: "training"},
				Containers: []corev1.Container{{Name: "pytorch", Image: "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
					Command:   []string{"torchrun", "train.py"},
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{framework.GPUResource: resource.MustParse("8")}}}},
			},
		}
	}
	return &trainingv1alpha1.TrainingJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: trainingv1alpha1.TrainingJobSpec{
			ReplicaSpecs: trainingv1alpha1.ReplicaSpecs{
				Master: trainingv1alpha1.ReplicaSpec{Template: tmpl(master)},
				Worker: &trainingv1alpha1.ReplicaSpec{Replicas: ptr.To(workers), Template: tmpl(worker)},
			},
			// No Volcano scheduler runs in the simulated cluster.
			Gang: trainingv1alpha1.GangPolicy{Scheduler: trainingv1alpha1.GangNone},
		},
	}
}

func waitJob(t *testing.T, job *trainingv1alpha1.TrainingJob, state trainingv1alpha1.JobState, timeout time.Duration) *trainingv1alpha1.TrainingJob {
	t.Helper()
	got := &trainingv1alpha1.TrainingJob{}
	eventually(t, timeout, func() (bool, string) {
		if err := cluster.Client.Get(context.Background(), client.ObjectKeyFromObject(job), got); err != nil {
			return false, err.Error()
		}
		return got.Status.State == state, fmt.Sprintf("%s: state %q, conditions %+v", job.Name, got.Status.State, got.Status.Conditions)
	})
	return got
}

func podsOf(t *testing.T, job *trainingv1alpha1.TrainingJob) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := cluster.Client.List(context.Background(), &pods, client.InNamespace(job.Namespace), client.MatchingLabels{"training.loom.dev/job-name": job.Name}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// Three jobs on six 8-GPU nodes, played by kwok: one succeeds, one has a
// worker SIGKILLed (137) in its first attempt and succeeds after one
// whole-gang restart, one has a worker exit 1 and fails with its running
// pods cleaned up. Deleting a job removes its pods and Service.
func TestTrainingJobsOnTheSimulatedCluster(t *testing.T) {
	ctx := context.Background()
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "tj-gpu", Count: 6, GPUs: 8, Labels: map[string]string{trainingPool: "training"}}); err != nil {
		t.Fatal(err)
	}
	_, m := startLoomManager(t)
	ns := "ml-team"
	if err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}

	ok := simJob(ns, "sim-ok", 1, map[string]string{"sim.loom.dev/exit-code": "0", "sim.loom.dev/run-for": "3s"},
		map[string]string{"sim.loom.dev/exit-code": "0", "sim.loom.dev/run-for": "30s"})
	retry := simJob(ns, "sim-retry", 1, map[string]string{"sim.loom.dev/exit-code": "0", "sim.loom.dev/run-for": "4s"},
		map[string]string{"sim.loom.dev/exit-code": "0", "sim.loom.dev/exit-code-attempt-0": "137", "sim.loom.dev/run-for": "1s"})
	bad := simJob(ns, "sim-fail", 1, map[string]string{"sim.loom.dev/exit-code": "0", "sim.loom.dev/run-for": "60s"},
		map[string]string{"sim.loom.dev/exit-code": "1", "sim.loom.dev/run-for": "1s"})
	for _, j := range []*trainingv1alpha1.TrainingJob{ok, retry, bad} {
		if err := cluster.Client.Create(ctx, j); err != nil {
			t.Fatal(err)
		}
	}

	got := waitJob(t, ok, trainingv1alpha1.StateSucceeded, 90*time.Second)
	if c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionScheduled); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("sim-ok Scheduled = %+v", c)
	}
	if got.Status.Restarts != 0 || got.Status.GPUs != 16 || got.Status.StartTime == nil || got.Status.CompletionTime == nil {
		t.Errorf("sim-ok status %+v", got.Status)
	}
	// cleanPodPolicy Running: the still-running worker is deleted, the
	// master's pod stays for its logs.
	eventually(t, 30*time.Second, func() (bool, string) {
		pods := podsOf(t, ok)
		return len(pods) == 1 && pods[0].Name == "sim-ok-master-0", fmt.Sprintf("%d pods left", len(pods))
	})

	got = waitJob(t, retry, trainingv1alpha1.StateSucceeded, 90*time.Second)
	if got.Status.Restarts != 1 || got.Status.Attempt != 1 {
		t.Errorf("sim-retry: restarts %d attempt %d, want 1 and 1", got.Status.Restarts, got.Status.Attempt)
	}

	got = waitJob(t, bad, trainingv1alpha1.StateFailed, 90*time.Second)
	c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionFailed)
	if c == nil || c.Reason != "PermanentFailure" || !strings.Contains(c.Message, "sim-fail-worker-0: container pytorch exited with code 1") {
		t.Errorf("sim-fail Failed = %+v", c)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		pods := podsOf(t, bad)
		return len(pods) == 1 && pods[0].Name == "sim-fail-worker-0", fmt.Sprintf("pods left: %d", len(pods))
	})

	metrics, err := m.Metrics(cluster.Config.BearerToken)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`loom_trainingjobs{state="Succeeded"} 2`, `loom_trainingjobs{state="Failed"} 1`, `loom_trainingjob_gang_restarts_total{namespace="ml-team"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if !strings.Contains(metrics, "loom_trainingjob_gang_scheduled_seconds_count") {
		t.Errorf("metrics lack the gang-scheduled histogram")
	}

	// The garbage collector removes a deleted job's pods and Service.
	if err := cluster.Client.Delete(ctx, ok); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sim-ok"}, &corev1.Service{})
		n := len(podsOf(t, ok))
		return apierrors.IsNotFound(err) && n == 0, fmt.Sprintf("service err %v, %d pods", err, n)
	})
}
