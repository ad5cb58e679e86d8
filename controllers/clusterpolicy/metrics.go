package clusterpolicy

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

var (
	policyReady = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "loom_clusterpolicy_ready", Help: "1 when the active ClusterPolicy is Ready, 0 otherwise.",
	}, []string{"policy"})
	componentDesired = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "loom_clusterpolicy_component_desired_nodes", Help: "Nodes an operand should run on.",
	}, []string{"component"})
	componentReady = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "loom_clusterpolicy_component_ready_nodes", Help: "Nodes an operand runs ready on.",
	}, []string{"component"})
	gpuNodesGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "loom_clusterpolicy_gpu_nodes", Help: "Nodes with GPUs (nvidia.com/gpu.present=true).",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(policyReady, componentDesired, componentReady, gpuNodesGauge)
}

// recordMetrics publishes the policy's state (the driver upgrade's node
// gauges are the driver upgrade controller's, loom_driver_upgrade_nodes).
func recordMetrics(name string, st *gpuv1alpha1.ClusterPolicyStatus) {
	ready := 0.0
	if st.State == gpuv1alpha1.PolicyReady {
		ready = 1
	}
	policyReady.Reset()
	policyReady.WithLabelValues(name).Set(ready)
	gpuNodesGauge.Set(float64(st.GPUNodes))
	componentDesired.Reset()
	componentReady.Reset()
	for _, c := range st.Components {
		if c.Enabled {
			componentDesired.WithLabelValues(c.Name).Set(float64(c.Desired))
			componentReady.WithLabelValues(c.Name).Set(float64(c.Ready))
		}
	}
}

// forgetMetrics removes the gauges of a policy that is gone or being
// deleted, if they are its (those of the policy in force): a stale
// loom_clusterpolicy_component_desired_nodes would keep LoomGPUExporterAbsent
// and LoomGPUOperandNotReady firing on a stack no longer there.
func forgetMetrics(name string) {
	if !policyReady.DeleteLabelValues(name) {
		return // not the policy the gauges are of
	}
	componentDesired.Reset()
	componentReady.Reset()
}
