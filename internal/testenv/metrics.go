package testenv

import (
	"testing"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// WritesCounted reads loom_writes_total for a kind, field owner, operation
// and result from the manager's metrics registry (0 when never counted).
func WritesCounted(t testing.TB, kind, fieldOwner, op, result string) float64 {
	t.Helper()
	return Counted(t, "loom_writes_total", map[string]string{"kind": kind, "field_owner": fieldOwner, "operation": op, "result": result})
}

// Counted reads the counter name of the given labels from the manager's
// metrics registry (0 when never counted).
func Counted(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// CountedAll is the sum of every series of the counter name (0 when none).
func CountedAll(t testing.TB, name string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
