package rayjob

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// KubeRay's RayJob metrics, by KubeRay v1.5's names, help and labels
// (ray-operator/controllers/ray/metrics/ray_job_metrics.go), so that
// dashboards and alerts built on KubeRay's keep working; and Loom's time
// to running.
var (
	executionDuration = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kuberay_job_execution_duration_seconds",
		Help: "Duration from when the RayJob CR’s JobDeploymentStatus transitions from Initializing to either the Retrying state or a terminal state, such as Complete or Failed. The Retrying state indicates that the CR previously failed and that spec.backoffLimit is enabled.",
	}, []string{"name", "namespace", "uid", "job_deployment_status", "retry_count"})
	jobInfoDesc = prometheus.NewDesc("kuberay_job_info",
		"Metadata information about RayJob custom resources", []string{"name", "namespace", "uid"}, nil)
	deploymentStatusDesc = prometheus.NewDesc("kuberay_job_deployment_status",
		"The RayJob's current deployment status", []string{"name", "namespace", "uid", "deployment_status"}, nil)
	// timeToRunning has no per-job labels: its series never go stale.
	timeToRunning = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "loom_rayjob_time_to_running_seconds",
		Help:    "Time from a RayJob's creation to its jobDeploymentStatus becoming Running (its cluster up and the job submitted); a retry or a resumed suspension counts again, from the same creation.",
		Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 7200},
	})
)

// jobsCollector reports kuberay_job_info and kuberay_job_deployment_status
// for the RayJobs Loom reconciles, from the cache at scrape time: nothing
// to go stale. The cache is the latest manager's (a test process starts
// several).
type jobsCollector struct {
	mu    sync.Mutex
	cache client.Reader
}

func (c *jobsCollector) set(r client.Reader) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cache = r
}

func (c *jobsCollector) reader() client.Reader {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cache
}

func (c *jobsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- jobInfoDesc
	ch <- deploymentStatusDesc
}

func (c *jobsCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.reader()
	if r == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var list rayv1.RayJobList
	if err := r.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	for i := range list.Items {
		j := &list.Items[i]
		if utils.ManagedByExternalController(j.Spec.ManagedBy) != nil {
			continue // another controller (MultiKueue) runs it and reports it
		}
		ch <- prometheus.MustNewConstMetric(jobInfoDesc, prometheus.GaugeValue, 1, j.Name, j.Namespace, string(j.UID))
		ch <- prometheus.MustNewConstMetric(deploymentStatusDesc, prometheus.GaugeValue, 1, j.Name, j.Namespace, string(j.UID),
			string(j.Status.JobDeploymentStatus))
	}
}

// observeStatus records what the status written (over was) says, as
// KubeRay does: kuberay_job_execution_duration_seconds when the job leaves
// a non-terminal state for a terminal one or Retrying (the time since the
// attempt's startTime, retry_count the failures before it); and Loom's
// time to running when it becomes Running.
func observeStatus(j *rayv1.RayJob, was, written *rayv1.RayJobStatus, now time.Time) {
	to := written.JobDeploymentStatus
	if !rayv1.IsJobDeploymentTerminal(was.JobDeploymentStatus) && written.StartTime != nil &&
		(rayv1.IsJobDeploymentTerminal(to) || to == rayv1.JobDeploymentStatusRetrying) {
		retries := strconv.Itoa(int(ptr.Deref(was.Failed, 0)))
		executionDuration.WithLabelValues(j.Name, j.Namespace, string(j.UID), string(to), retries).Set(now.Sub(written.StartTime.Time).Seconds())
	}
	if was.JobDeploymentStatus != rayv1.JobDeploymentStatusRunning && to == rayv1.JobDeploymentStatusRunning && !j.CreationTimestamp.IsZero() {
		timeToRunning.Observe(now.Sub(j.CreationTimestamp.Time).Seconds())
	}
}

// forgetMetrics drops a deleted RayJob's series, as KubeRay does.
func forgetMetrics(key client.ObjectKey) {
	executionDuration.DeletePartialMatch(prometheus.Labels{"name": key.Name, "namespace": key.Namespace})
}

var (
	registerOnce sync.Once
	jobs         = &jobsCollector{}
)

// registerMetrics registers the RayJob metrics in controller-runtime's
// registry once per process, the collector reading cache.
func registerMetrics(cache client.Reader) {
	jobs.set(cache)
	registerOnce.Do(func() {
		ctrlmetrics.Registry.MustRegister(executionDuration, timeToRunning, jobs)
	})
}
