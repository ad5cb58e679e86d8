package training

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
)

// The Suspended condition of a job Kueue holds says what holds it now,
// not what held it first: Kueue's message changes while the job waits (the
// quota it lacks, a LocalQueue created or missing), and Ready and
// Scheduled, which carry the same words, follow it.
func TestKueueSuspendedFollowsKueuesWord(t *testing.T) {
	job := newJob("ns", "waiting", 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "parked"}
	wl := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wl"}, Spec: kueue.WorkloadSpec{QueueName: "parked"}}
	word := func(msg string) {
		wl.Status.Conditions = []metav1.Condition{{Type: kueue.CondQuotaReserved, Status: metav1.ConditionFalse, Reason: "Inadmissible", Message: msg}}
	}
	now := time.Now()
	pass := func() trainingv1alpha1.TrainingJobStatus {
		obs := observed{now: now, kueue: kueueObs{queued: true, served: true, wl: wl}}
		st := decide(job, obs, trainingv1alpha1.GangNone).status
		job.Status = st
		now = now.Add(time.Second)
		return st
	}
	word("LocalQueue parked doesn't exist")
	st := pass()
	if c := cond(&trainingv1alpha1.TrainingJob{Status: st}, trainingv1alpha1.ConditionSuspended); !strings.Contains(c.Message, "LocalQueue parked doesn't exist") {
		t.Fatalf("Suspended %q does not say the LocalQueue is missing", c.Message)
	}
	word("couldn't assign flavors to pod set master: insufficient unused quota for cpu in flavor default, 1 more needed")
	st = pass()
	for _, ct := range []string{trainingv1alpha1.ConditionSuspended, trainingv1alpha1.ConditionReady} {
		if c := cond(&trainingv1alpha1.TrainingJob{Status: st}, ct); !strings.Contains(c.Message, "insufficient unused quota") || c.Reason != ReasonQueuedInKueue {
			t.Errorf("%s = %s %q, want Kueue's new word", ct, c.Reason, c.Message)
		}
	}
}
