package rayjob

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/loom-dev/loom/internal/testenv"
)

// KubeRay's kuberay_job_info and kuberay_job_deployment_status, by
// KubeRay's names, help and labels, for the RayJobs Loom reconciles (not
// one MultiKueue manages).
func TestJobsCollector(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := rayv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{
		&rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", UID: "ua"}, Status: rayv1.RayJobStatus{JobDeploymentStatus: rayv1.JobDeploymentStatusRunning}},
		&rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "ns", UID: "ub"}},
		&rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uc"}, Spec: rayv1.RayJobSpec{ManagedBy: ptr.To("kueue.x-k8s.io/multikueue")}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	want := `
# HELP kuberay_job_deployment_status The RayJob's current deployment status
# TYPE kuberay_job_deployment_status gauge
kuberay_job_deployment_status{deployment_status="",name="b",namespace="ns",uid="ub"} 1
kuberay_job_deployment_status{deployment_status="Running",name="a",namespace="ns",uid="ua"} 1
# HELP kuberay_job_info Metadata information about RayJob custom resources
# TYPE kuberay_job_info gauge
kuberay_job_info{name="a",namespace="ns",uid="ua"} 1
kuberay_job_info{name="b",namespace="ns",uid="ub"} 1
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(&jobsCollector{cache: testenv.NoCopyLists{Reader: c, T: t}})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// kuberay_job_execution_duration_seconds is set as KubeRay sets it: when
// an attempt leaves a non-terminal state for Retrying or a terminal one,
// from the attempt's startTime, retry_count the failures before it; it
// goes with the RayJob. Loom's time to running counts each start from the
// RayJob's creation.
func TestObserveStatus(t *testing.T) {
	now := time.Now()
	j := &rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "dur", UID: "ud", CreationTimestamp: metav1.NewTime(now.Add(-90 * time.Second))}}
	start := &metav1.Time{Time: now.Add(-42 * time.Second)}
	st := func(jds rayv1.JobDeploymentStatus, failed int32) *rayv1.RayJobStatus {
		return &rayv1.RayJobStatus{JobDeploymentStatus: jds, StartTime: start, Failed: ptr.To(failed)}
	}
	running, complete := rayv1.JobDeploymentStatusRunning, rayv1.JobDeploymentStatusComplete
	n0, s0 := samples(t, timeToRunning)
	observeStatus(j, st(rayv1.JobDeploymentStatusInitializing, 0), st(running, 0), now)
	observeStatus(j, st(running, 0), st(running, 0), now) // no transition: not again
	if n, s := samples(t, timeToRunning); n != n0+1 || s-s0 != 90 {
		t.Fatalf("time to running: %d samples adding %v s, want 1 of 90 s", n-n0, s-s0)
	}
	observeStatus(j, st(running, 0), st(rayv1.JobDeploymentStatusRetrying, 1), now)
	observeStatus(j, st(running, 1), st(rayv1.JobDeploymentStatusFailed, 2), now)
	observeStatus(j, st(running, 2), st(complete, 2), now)
	observeStatus(j, st(complete, 2), st(complete, 2), now.Add(time.Hour)) // terminal already: not moved
	want := `
# HELP kuberay_job_execution_duration_seconds Duration from when the RayJob CR’s JobDeploymentStatus transitions from Initializing to either the Retrying state or a terminal state, such as Complete or Failed. The Retrying state indicates that the CR previously failed and that spec.backoffLimit is enabled.
# TYPE kuberay_job_execution_duration_seconds gauge
kuberay_job_execution_duration_seconds{job_deployment_status="Complete",name="d",namespace="dur",retry_count="2",uid="ud"} 42
kuberay_job_execution_duration_seconds{job_deployment_status="Failed",name="d",namespace="dur",retry_count="1",uid="ud"} 42
kuberay_job_execution_duration_seconds{job_deployment_status="Retrying",name="d",namespace="dur",retry_count="0",uid="ud"} 42
`
	if err := testutil.CollectAndCompare(executionDuration, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	forgetMetrics(client.ObjectKeyFromObject(j))
	if n := testutil.CollectAndCount(executionDuration, "kuberay_job_execution_duration_seconds"); n != 0 {
		t.Fatalf("%d series left after the RayJob went", n)
	}
}

// samples is how many observations a histogram has and their sum.
func samples(t *testing.T, h prometheus.Collector) (uint64, float64) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(h)
	families, err := reg.Gather()
	if err != nil || len(families) != 1 || len(families[0].GetMetric()) != 1 {
		t.Fatalf("gathering the histogram: %v %v", families, err)
	}
	hist := families[0].GetMetric()[0].GetHistogram()
	return hist.GetSampleCount(), hist.GetSampleSum()
}
