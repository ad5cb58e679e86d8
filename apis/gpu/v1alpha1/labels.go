package v1alpha1

import corev1 "k8s.io/api/core/v1"

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

// LabelDeployDriver is GPU Operator's per-node switch of the driver:
// "false" or DeployDriverPreInstalled keeps the driver DaemonSets off the
// node. The labeller sets it to DeployDriverPreInstalled on a node whose
// agent reads the GPUs through the host's own driver and on which no
// driver pod of Loom's is ready, when the node has no value of it.
const (
	LabelDeployDriver        = "nvidia.com/gpu.deploy.driver"
	DeployDriverPreInstalled = "pre-installed"
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

// What Loom's GPU labeller (the gpu-labels controller) records on a Node
// beside its nvidia.com/* labels; its uninstall cleanup removes them.
const (
	// FieldOwnerGPULabels is the labeller's server-side-apply field
	// manager: on Nodes it owns exactly the labels it set, so applying a
	// smaller set removes the rest of its own and never touches anyone
	// else's.
	FieldOwnerGPULabels = "loom-gpu-labels"
	// AnnotationManagedLabels lists the label keys the labeller set on a
	// Node. The cache strips managedFields, so this is how a pass tells,
	// from the cache alone, whether an apply would change anything.
	AnnotationManagedLabels = "gpu.loom.dev/managed-labels"
	// AnnotationUnhealthyTaint records the value of the
	// nvidia.com/gpu.unhealthy taint the labeller set on a Node (the cache
	// holds Nodes' metadata only, not their taints).
	AnnotationUnhealthyTaint = "gpu.loom.dev/unhealthy-taint"
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
	// AnnotationFailedNotReady marks a node whose upgrade failed because it
	// stayed NotReady or unreachable too long: once Ready again it retries
	// (the same template) as soon as the budget allows.
	AnnotationFailedNotReady = "gpu.loom.dev/driver-upgrade-failed-not-ready"
	// AnnotationLost records the steps of its upgrade a node was lost in
	// (NotReady too long) and the driver template hash they were on, as
	// "drain,driver:<template>": a node retries each step once per driver
	// template; lost in the same step again, it stays failed.
	AnnotationLost = "gpu.loom.dev/driver-upgrade-lost"
	// AnnotationClaim names the ClusterPolicy whose driver upgrade enrolled
	// the node. Loom writes it in the same patch as the node's first state
	// and its cordon, and steps, cordons and uncordons only nodes that carry
	// it: a state label without it (GPU Operator's, a migration's, one set
	// by hand) is ignored and reported.
	AnnotationClaim = "gpu.loom.dev/driver-upgrade-claim"
	// AnnotationTarget is the driver pod template hash the node's upgrade
	// is for; a new one during validation restarts the node's driver again.
	AnnotationTarget = "gpu.loom.dev/driver-upgrade-target"
	// AnnotationBlocked says which eviction the API server refused (other
	// than a disruption budget's 429) and its answer; the node keeps its
	// state, retries, and fails at its phase timeout.
	AnnotationBlocked = "gpu.loom.dev/driver-upgrade-blocked"
	// AnnotationFailureAcknowledged marks a failed node that a resume
	// (AnnotationResume) let the rollout go past: it no longer counts
	// against maxFailures.
	AnnotationFailureAcknowledged = "gpu.loom.dev/driver-upgrade-failure-acknowledged"
	// AnnotationResume on a ClusterPolicy resumes a driver upgrade paused by
	// maxFailures; Loom removes it once it has acknowledged the failed nodes.
	AnnotationResume = "gpu.loom.dev/driver-upgrade-resume"

	// ConditionDriverUpgrade is the driver upgrade controller's condition
	// on the ClusterPolicy: True (reason UpToDate or DriverDisabled) when no
	// node waits for, is in or needs an upgrade; False with reason
	// ReasonUpgradeInProgress, ReasonUpgradePaused, ReasonUpgradeInvalid
	// or ReasonAutoUpgradeDisabled otherwise. Its message names the failed,
	// blocked and ignored nodes.
	ConditionDriverUpgrade  = "DriverUpgrade"
	ReasonUpgradeUpToDate   = "UpToDate"
	ReasonDriverDisabled    = "DriverDisabled"
	ReasonUpgradeInProgress = "UpgradeInProgress"
	ReasonUpgradePaused     = "UpgradePaused"
	ReasonUpgradeInvalid    = "InvalidUpgradePolicy"
	// ReasonAutoUpgradeDisabled: autoUpgrade is false and GPU nodes run an
	// older driver than the policy's; each waits for its driver pod to be
	// deleted (or for autoUpgrade).
	ReasonAutoUpgradeDisabled = "AutoUpgradeDisabled"
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

// The driver's per-OS DaemonSets and the MIG and device plugin configs.
const (
	// LabelOSReleaseID and LabelOSReleaseVersionID are node feature
	// discovery's OS labels (ID and VERSION_ID of /etc/os-release): a
	// node's driver image is chosen from them, else from its
	// status.nodeInfo.osImage.
	LabelOSReleaseID        = "feature.node.kubernetes.io/system-os_release.ID"
	LabelOSReleaseVersionID = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
	// LabelKernelVersion is node feature discovery's kernel label.
	LabelKernelVersion = "feature.node.kubernetes.io/kernel-version.full"
	// LabelDriverTarget on a driver DaemonSet and its pods is the OS (and
	// kernel, for precompiled drivers) the DaemonSet serves, e.g.
	// ubuntu22.04; on a GPU node, set by the ClusterPolicy, the target of
	// the driver DaemonSet that places it.
	LabelDriverTarget = "gpu.loom.dev/driver-target"
	// LabelDevicePluginConfig names the device plugin config (a key of
	// devicePlugin.config.configMapName) a node runs.
	LabelDevicePluginConfig = "nvidia.com/device-plugin.config"
	// AnnotationMIGConfigFailure on a node says why its MIG manager failed
	// to apply the layout (optional; GPU Operator's manager does not set it).
	AnnotationMIGConfigFailure = "gpu.loom.dev/mig-config-failure"
	// MIGConfigKey is the key of the mig-parted config in the MIG
	// manager's ConfigMap (Loom's default, or migManager.configMapName).
	MIGConfigKey = "config.yaml"
)

// MIG config states the MIG manager reports in LabelMIGConfigState.
const (
	MIGConfigPending = "pending"
	// MIGConfigRebooting: the layout needs a reboot, which is under way.
	MIGConfigRebooting = "rebooting"
	MIGConfigSuccess   = "success"
	MIGConfigFailed    = "failed"
)

// GPU presence, sharing and health labels and taints of the node labeller.
const (
	// LabelSharingStrategy is GFD's sharing strategy of nvidia.com/gpu:
	// none, time-slicing or mps.
	LabelSharingStrategy = "nvidia.com/gpu.sharing-strategy"
	// NFD's labels of a node with an NVIDIA PCI device: any class, 3D
	// controller, VGA controller. Any one set to "true" makes the node
	// nvidia.com/gpu.present before a driver is loaded.
	LabelNFDPCINVIDIA        = "feature.node.kubernetes.io/pci-10de.present"
	LabelNFDPCI3DNVIDIA      = "feature.node.kubernetes.io/pci-0302_10de.present"
	LabelNFDPCIDisplayNVIDIA = "feature.node.kubernetes.io/pci-0300_10de.present"
	// TaintUnhealthy is the NoSchedule taint (value: the reason of the first
	// unhealthy GPU) on nodes with unhealthy GPUs, when the policy's
	// health.taintUnhealthyNodes is on.
	TaintUnhealthy = "nvidia.com/gpu.unhealthy"
)

// IsUnhealthyTaint reports whether t is of the labeller's kind:
// TaintUnhealthy with the NoSchedule effect. One of the key with another
// effect is someone else's; one of this kind is Loom's only while the
// Node's AnnotationUnhealthyTaint records it.
func IsUnhealthyTaint(t corev1.Taint) bool {
	return t.Key == TaintUnhealthy && t.Effect == corev1.TaintEffectNoSchedule
}
