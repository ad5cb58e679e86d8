package training

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
)

// With the Kueue integration off (--kueue=false), the queue label means
// nothing: the job is not held for a Workload.
func TestKueueOffIgnoresTheQueueLabel(t *testing.T) {
	job := &trainingv1alpha1.TrainingJob{ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "ns",
		Labels: map[string]string{kueue.QueueLabel: "team-a"}}}
	obs := &observed{kueue: kueueObs{queued: true}}
	var off *kueueJobs
	if err := off.observe(context.Background(), job, obs); err != nil {
		t.Fatal(err)
	}
	if obs.kueue.queued || obs.kueue.holds() {
		t.Errorf("Kueue off: %+v", obs.kueue)
	}
}
