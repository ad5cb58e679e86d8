package v1alpha1

// The label, annotation and selector vocabulary the GPU stack's
// reconcilers (ClusterPolicy, driver upgrade, node labels) and the
// monitoring reconcilers share. Node labels use GPU feature discovery's and
// GPU Operator's names, so that existing node selectors keep working.

// LabelPrefix is the prefix of every node label the labeller sets.
const LabelPrefix = "nvidia.com/"

// Node labels, as GPU feature discovery names them.
const (
	LabelPresent      = "nvidia.com/gpu.present"
	LabelCount        = "nvidia.com/gpu.count"
	LabelProduct      = "nvidia.com/gpu.product"
	LabelMemory       = "nvidia.com/gpu.memory"
	LabelFamily       = "nvidia.com/gpu.family"
	LabelComputeMajor = "nvidia.com/gpu.compute.major"
	LabelComputeMinor = "nvidia.com/gpu.compute.minor"
	LabelReplicas     = "nvidia.com/gpu.replicas"
	LabelMIGCapable   = "nvidia.com/mig.capable"
	LabelMIGStrategy  = "nvidia.com/mig.strategy"
	// LabelMIGConfig names the MIG layout the MIG manager applies to a node
	// (set by people or tools); the manager reports its progress in
	// LabelMIGConfigState (pending, success, failed).
	LabelMIGConfig      = "nvidia.com/mig.config"
	LabelMIGConfigState = "nvidia.com/mig.config.state"
	LabelDriverMajor    = "nvidia.com/cuda.driver-version.major"
	LabelDriverMinor    = "nvidia.com/cuda.driver-version.minor"
	LabelDriverRevision = "nvidia.com/cuda.driver-version.revision"
	LabelDriverFull     = "nvidia.com/cuda.driver-version.full"
	LabelRuntimeMajor   = "nvidia.com/cuda.runtime-version.major"
	LabelRuntimeMinor   = "nvidia.com/cuda.runtime-version.minor"
	LabelRuntimeFull    = "nvidia.com/cuda.runtime-version.full"
)

// Labels on every operand object (DaemonSets, their pods, RBAC, ConfigMaps).
// An operand's pods are selected by LabelComponent=<operand name>, e.g.
// dcgm-exporter's by ExporterSelector.
const (
	LabelComponent = "app.kubernetes.io/component"
	LabelPolicy    = "gpu.loom.dev/clusterpolicy"
)

// OperandObjectName is the name of an operand's DaemonSet and
// ServiceAccount in Loom's namespace, e.g. loom-driver.
func OperandObjectName(operand string) string { return "loom-" + operand }

// ExporterSelector selects dcgm-exporter's pods (the monitoring Service's
// selector).
func ExporterSelector() map[string]string {
	return map[string]string{LabelComponent: OperandDCGMExporter}
}

// Pod template annotations of the operands.
const (
	// AnnotationConfigHash on a pod template changes when the operand's
	// configuration does, so exactly that operand's pods roll.
	AnnotationConfigHash = "gpu.loom.dev/config-hash"
	// AnnotationTemplateHash on a pod template (and so on its pods) is the
	// hash of the template itself: the driver upgrade compares it.
	AnnotationTemplateHash = "gpu.loom.dev/template-hash"
)

// The per-node driver upgrade state, in GPU Operator's label and values.
const (
	LabelUpgradeState = "nvidia.com/gpu-driver-upgrade-state"

	UpgradeRequired     = "upgrade-required"
	WaitForJobsRequired = "wait-for-jobs-required"
	PodDeletionRequired = "pod-deletion-required"
	DrainRequired       = "drain-required"
	PodRestartRequired  = "pod-restart-required"
	ValidationRequired  = "validation-required"
	UncordonRequired    = "uncordon-required"
	UpgradeDone         = "upgrade-done"
	UpgradeFailed       = "upgrade-failed"

	// AnnotationWasCordoned marks a node someone else had cordoned before its
	// upgrade: it stays cordoned afterwards.
	AnnotationWasCordoned = "gpu.loom.dev/driver-upgrade-was-cordoned"
	// AnnotationUpgradeStarted is when the node's upgrade began (RFC 3339).
	AnnotationUpgradeStarted = "gpu.loom.dev/driver-upgrade-started"
	// AnnotationPhaseStarted is when the node entered its current state:
	// the waits and timeouts of each state count from it.
	AnnotationPhaseStarted = "gpu.loom.dev/driver-upgrade-phase-started"
	// AnnotationFailure says why a node's upgrade failed; the node stays
	// cordoned and in upgrade-failed until a new driver version (a new
	// template) is rolled out, which retries it.
	AnnotationFailure = "gpu.loom.dev/driver-upgrade-failure"
	// AnnotationFailedTemplate is the driver template hash that failed.
	AnnotationFailedTemplate = "gpu.loom.dev/driver-upgrade-failed-template"
)

// UpgradeStates are the values of LabelUpgradeState Loom knows, in the
// order a node goes through them (upgrade-failed last). A node with another
// value is left alone (not advanced, not started) and reported until a
// person removes the label.
var UpgradeStates = []string{UpgradeRequired, WaitForJobsRequired, PodDeletionRequired, DrainRequired,
	PodRestartRequired, ValidationRequired, UncordonRequired, UpgradeDone, UpgradeFailed}

// KnownUpgradeState reports whether s is "" (never upgraded) or one of
// UpgradeStates.
func KnownUpgradeState(s string) bool {
	if s == "" {
		return true
	}
	for _, k := range UpgradeStates {
		if s == k {
			return true
		}
	}
	return false
}
