package training

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// loom_trainingjobs counts the cached jobs by state at scrape time (a job
// without a state yet is Pending), every state named, without copying the
// jobs out of the cache.
func TestJobsCollector(t *testing.T) {
	job := func(name string, s trainingv1alpha1.JobState) *trainingv1alpha1.TrainingJob {
		return &trainingv1alpha1.TrainingJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Status: trainingv1alpha1.TrainingJobStatus{State: s}}
	}
	c := fake.NewClientBuilder().WithScheme(manager.Scheme()).WithObjects(
		job("new", ""), job("waiting", trainingv1alpha1.StatePending), job("a", trainingv1alpha1.StateRunning),
		job("b", trainingv1alpha1.StateRunning), job("done", trainingv1alpha1.StateSucceeded)).Build()
	want := `
# HELP loom_trainingjobs TrainingJobs by state.
# TYPE loom_trainingjobs gauge
loom_trainingjobs{state="Failed"} 0
loom_trainingjobs{state="Held"} 0
loom_trainingjobs{state="Pending"} 2
loom_trainingjobs{state="Restarting"} 0
loom_trainingjobs{state="Running"} 2
loom_trainingjobs{state="Succeeded"} 1
loom_trainingjobs{state="Suspended"} 0
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(jobsCollector{cache: testenv.NoCopyLists{Reader: c, T: t}})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
