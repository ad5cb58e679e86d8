package training

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
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
)

var allStates = []trainingv1alpha1.JobState{
	trainingv1alpha1.StateHeld, trainingv1alpha1.StatePending, trainingv1alpha1.StateRunning, trainingv1alpha1.StateRestarting,
	trainingv1alpha1.StateSuspended, trainingv1alpha1.StateSucceeded, trainingv1alpha1.StateFailed,
}

// jobsCollector counts jobs by state from the cache at scrape time: no
// bookkeeping to go stale, no API calls.
type jobsCollector struct{ cache cache.Cache }

func (c jobsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- jobsDesc }

func (c jobsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var list trainingv1alpha1.TrainingJobList
	if err := c.cache.List(ctx, &list); err != nil {
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
	ctrlmetrics.Registry.MustRegister(gangScheduled, gangRestarts, jobsCollector{cache: c})
}
