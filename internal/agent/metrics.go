package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the agent's own metrics.
type Metrics struct {
	Registry    *prometheus.Registry
	duration    prometheus.Histogram
	errors      *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	writes      prometheus.Counter
}

// NewMetrics registers the agent's metrics on a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "loom_node_agent_collection_duration_seconds", Help: "Time to read the inventory through NVML.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 8),
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loom_node_agent_errors_total", Help: "Failures by stage: read (the GPUNode), pci, nvml_init, collect, write.",
		}, []string{"stage"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "loom_node_agent_last_success_timestamp_seconds", Help: "When the inventory was last collected and published.",
		}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loom_node_agent_status_writes_total", Help: "Writes to the API server (only when the inventory changed).",
		}),
	}
	m.Registry.MustRegister(m.duration, m.errors, m.lastSuccess, m.writes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
