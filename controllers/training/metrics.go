package training

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
)

var (
	gangScheduled = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "loom_trainingjob_gang_scheduled_seconds",
		Help:    "Time from a TrainingJob's creation (or its gang's restart) to every pod of the gang being placed.",
		Buckets: []float64{0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
	})
	gangRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "loom_trainingjob_gang_restarts_total",
		Help: "Whole-gang restarts of TrainingJobs after a retryable failure.",
	}, []string{"namespace"})
	jobsDesc = prometheus.NewDesc("loom_trainingjobs", "TrainingJobs by state.", []string{"state"}, nil)
	// The live numbers behind a waiting job's verdict: its status states
	// the verdict only, so that it is not rewritten whenever a GPU
	// elsewhere is allocated or freed; these follow every re-evaluation.
	pendingGPUs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "loom_trainingjob_pending_gpus",
		Help: "GPUs an unscheduled TrainingJob's gang waits for (of the GPU resource its inventory verdict is about); no series once it is scheduled, finished, suspended or held.",
	}, []string{"namespace", "name"})
	pendingFree = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "loom_trainingjob_pending_free_gpus",
		Help: "Of that GPU resource, what is free now on the nodes an unscheduled TrainingJob's pods may use, at its last re-evaluation.",
	}, []string{"namespace", "name"})
)

var allStates = []trainingv1alpha1.JobState{
	trainingv1alpha1.StateHeld, trainingv1alpha1.StatePending, trainingv1alpha1.StateRunning, trainingv1alpha1.StateRestarting,
	trainingv1alpha1.StateSuspended, trainingv1alpha1.StateSucceeded, trainingv1alpha1.StateFailed,
}

// jobsCollector counts jobs by state from the cache at scrape time: no
// bookkeeping to go stale, no API calls.
type jobsCollector struct{ cache client.Reader }

func (c jobsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- jobsDesc }

func (c jobsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var list trainingv1alpha1.TrainingJobList
	if err := c.cache.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	counts := map[trainingv1alpha1.JobState]float64{}
	for i := range list.Items {
		s := list.Items[i].Status.State
		if s == "" {
			s = trainingv1alpha1.StatePending
		}
		counts[s]++
	}
	for _, s := range allStates {
		ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, counts[s], string(s))
	}
}

var registered bool

// registerMetrics registers the training metrics once per process.
func registerMetrics(c cache.Cache) {
	if registered {
		return
	}
	registered = true
	ctrlmetrics.Registry.MustRegister(gangScheduled, gangRestarts, pendingGPUs, pendingFree, jobsCollector{cache: c})
}

// waiting says whether a job, as decided, waits to be scheduled: not
// scheduled, not finished, not suspended (by itself or by Kueue) and not
// held, with a gang that asks for GPUs.
func waiting(st *trainingv1alpha1.TrainingJobStatus, fit inventory.FitResult) bool {
	return fit.Units > 0 && !st.Finished() && !condTrue(st, trainingv1alpha1.ConditionScheduled) &&
		st.State != trainingv1alpha1.StateSuspended && st.State != trainingv1alpha1.StateHeld
}

// gaugePending sets the job's pending gauges from the inventory's verdict
// while it waits, and drops them once it does not.
func gaugePending(job *trainingv1alpha1.TrainingJob, st *trainingv1alpha1.TrainingJobStatus, fit inventory.FitResult) {
	if !waiting(st, fit) {
		forgetPending(job.Namespace, job.Name)
		return
	}
	pendingGPUs.WithLabelValues(job.Namespace, job.Name).Set(float64(fit.Units))
	pendingFree.WithLabelValues(job.Namespace, job.Name).Set(float64(fit.Free))
}

func forgetPending(namespace, name string) {
	pendingGPUs.DeleteLabelValues(namespace, name)
	pendingFree.DeleteLabelValues(namespace, name)
}
