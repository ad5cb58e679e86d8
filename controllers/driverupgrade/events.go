package driverupgrade

import (
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// EventReason is the reason of every driver upgrade event on a Node: GPU
// Operator's upgrade library uses the same, so runbooks and alerts that
// select on it keep working.
const EventReason = "GPUDriverUpgrade"

// Why a release lets go of a node, for its event.
const (
	releasedPolicy   = "its policy is gone or its driver disabled"
	releasedUnplaced = "no driver DaemonSet of its policy selects the node any more: nvidia.com/gpu.deploy.driver=false or =pre-installed, " +
		"a node selector, a taint, or an OS without a driver; this is no failure"
)

// event records a node's step: Normal for progress, Warning for a failure;
// released says why Loom let go of the node ("": it did not).
func (r *Reconciler) event(node *corev1.Node, from, to, released string) {
	if r.Recorder == nil {
		return
	}
	switch {
	case released != "":
		r.Recorder.Eventf(node, nil, corev1.EventTypeNormal, EventReason, "Release",
			"Loom released the node from its driver upgrade (%s)", released)
	case to == gpuv1alpha1.UpgradeFailed:
		r.Recorder.Eventf(node, nil, corev1.EventTypeWarning, EventReason, "Upgrade",
			"Driver upgrade failed in %s; the node stays cordoned (see its annotation %s)", from, gpuv1alpha1.AnnotationFailure)
	case to == "":
		r.Recorder.Eventf(node, nil, corev1.EventTypeNormal, EventReason, "Upgrade", "Removed the node's driver upgrade state label")
	default:
		r.Recorder.Eventf(node, nil, corev1.EventTypeNormal, EventReason, "Upgrade", "Successfully updated node state label to %s", to)
	}
}

// warn records what Loom made of a node's upgrade annotations it cannot
// use, as a Warning.
func (r *Reconciler) warn(node *corev1.Node, msg string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(node, nil, corev1.EventTypeWarning, EventReason, "Upgrade", "%s", msg)
	}
}

// upgradeNodes is the rollout by node, as the last pass of each policy
// counted it.
var upgradeNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "loom_driver_upgrade_nodes",
	Help: "GPU nodes by driver upgrade progress: done (run the wanted driver), pending (waiting for the budget), in_progress, failed.",
}, []string{"policy", "state"})

func init() { ctrlmetrics.Registry.MustRegister(upgradeNodes) }

// recordGauges publishes a pass's summary.
func recordGauges(policy string, s summary) {
	for state, n := range map[string]int{"done": s.upToDate, "pending": s.waiting, "in_progress": s.inProgress, "failed": len(s.failed)} {
		upgradeNodes.WithLabelValues(policy, state).Set(float64(n))
	}
}

// forgetGauges removes the gauges of a policy that is gone: its failed
// nodes, released with it, must not keep LoomGPUDriverUpgradeFailed
// firing until the manager restarts.
func forgetGauges(policy string) {
	upgradeNodes.DeletePartialMatch(prometheus.Labels{"policy": policy})
}
