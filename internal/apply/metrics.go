package apply

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// writes counts every write decision at the writer: how many writes a
// steady cluster is spared (skipped, coalesced) beside those it makes.
var writes = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "loom_writes_total",
	Help: "Child and status writes decided by Loom's writer, by kind, field owner, operation (apply, patch, delete, status) and result (written, skipped, coalesced, error).",
}, []string{"kind", "field_owner", "operation", "result"})

func init() { ctrlmetrics.Registry.MustRegister(writes) }

func count(kind, fieldOwner, op, result string) {
	writes.WithLabelValues(kind, fieldOwner, op, result).Inc()
}
