package training

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/testenv"
)

// runAdmitted creates a queued job, admits its Workload as Kueue does and
// runs its gang.
func runAdmitted(t *testing.T, ns, name string) (*trainingv1alpha1.TrainingJob, *unstructured.Unstructured) {
	t.Helper()
	job := newJob(ns, name, 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	create(t, job)
	var u *unstructured.Unstructured
	testenv.Eventually(t, 20*time.Second, func() (err error) { u, err = workloadOf(t, job); return err })
	admitWorkload(t, u)
	setPods(t, waitPods(t, job, 2, 1), corev1.PodRunning, 0)
	waitState(t, job, trainingv1alpha1.StateRunning)
	u, err := workloadOf(t, job)
	if err != nil {
		t.Fatal(err)
	}
	return job, u
}

// kueueEvicts sets the Evicted condition of the admitted Workload u (and
// extra status fields, JSON), as Kueue's workload controller does.
func kueueEvicts(t *testing.T, u *unstructured.Unstructured, reason, msg, extra string) {
	t.Helper()
	now := metav1.Now().UTC().Format(time.RFC3339)
	statusPatch(t, u, fmt.Sprintf(`{"status":{%s"conditions":[`+
		`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
		`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q},`+
		`{"type":"Evicted","status":"True","reason":%q,"message":%q,"lastTransitionTime":%q}]}}`, extra, now, now, reason, msg, now))
}

// waitWorkload waits until the job's Workload passes check.
func waitWorkload(t *testing.T, job *trainingv1alpha1.TrainingJob, check func(*kueue.Workload) error) *unstructured.Unstructured {
	t.Helper()
	var u *unstructured.Unstructured
	testenv.Eventually(t, 20*time.Second, func() error {
		w, got, err := parsedWorkloadOf(t, job)
		if err != nil {
			return err
		}
		u = got
		return check(w)
	})
	return u
}

// waitSuspended waits until the job has no pod and says Suspended with
// reason and a message containing each of msgs.
func waitSuspended(t *testing.T, job *trainingv1alpha1.TrainingJob, reason string, msgs ...string) *trainingv1alpha1.TrainingJob {
	t.Helper()
	var got *trainingv1alpha1.TrainingJob
	testenv.Eventually(t, 20*time.Second, func() error {
		if n := len(jobPods(t, job)); n != 0 {
			return fmt.Errorf("%d pods left", n)
		}
		got = getJob(t, job)
		c := cond(got, trainingv1alpha1.ConditionSuspended)
		if got.Status.State != trainingv1alpha1.StateSuspended || c.Status != metav1.ConditionTrue || c.Reason != reason {
			return fmt.Errorf("state %s, Suspended %+v", got.Status.State, c)
		}
		for _, m := range msgs {
			if !strings.Contains(c.Message, m) {
				return fmt.Errorf("Suspended %q does not say %q", c.Message, m)
			}
		}
		return nil
	})
	return got
}

// A job evicted for PodsReadyTimeout waits out Kueue's requeue backoff:
// its Suspended condition says when Kueue queues it again and how many
// times it has, and the job is not written while it waits.
func TestKueueRequeueBackoffSaysWhen(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-backoff")
	startManager(t)

	job, u := runAdmitted(t, ns, "slow")
	at := metav1.NewTime(time.Now().Add(time.Hour).Truncate(time.Second))
	kueueEvicts(t, u, "PodsReadyTimeout", "Exceeded the PodsReady timeout "+ns+"/"+u.GetName(),
		fmt.Sprintf(`"requeueState":{"count":2,"requeueAt":%q},`, at.UTC().Format(time.RFC3339)))
	waitWorkload(t, job, func(w *kueue.Workload) error {
		if w.QuotaReserved() {
			return fmt.Errorf("the evicted Workload still holds its quota")
		}
		return nil
	})
	got := waitSuspended(t, job, ReasonEvictedByKueue, "Exceeded the PodsReady timeout",
		"Kueue queues it again at "+at.UTC().Format(time.RFC3339)+" (requeue 2)")
	time.Sleep(3 * time.Second)
	if again := getJob(t, job); again.ResourceVersion != got.ResourceVersion {
		t.Errorf("the job was written while it waits out the backoff: %+v", again.Status.Conditions)
	}
}
