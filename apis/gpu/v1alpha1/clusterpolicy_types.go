package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ImageSpec names a container image. Unset fields take the operand's
// built-in default, field by field, so overriding only the version is
// enough.
// +kubebuilder:validation:XValidation:rule="!(has(self.repository) || has(self.image)) || has(self.version)",message="a custom repository or image needs a version: the built-in version belongs to the built-in image"
type ImageSpec struct {
	// Repository, e.g. nvcr.io/nvidia or registry.example:5000/team: a
	// registry host (and port), then lower-case path components, as an
	// image reference writes them (ImageRepositoryPattern).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?([.][A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:[0-9]{1,5})?(/[a-z0-9]+(([.]|_|__|-+)[a-z0-9]+)*)*$`
	Repository string `json:"repository,omitempty"`
	// Image name within the repository, e.g. driver or k8s/dcgm-exporter:
	// lower-case path components (ImageNamePattern).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[a-z0-9]+(([.]|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([.]|_|__|-+)[a-z0-9]+)*)*$`
	Image string `json:"image,omitempty"`
	// Version is the image tag, e.g. 570.172.08 or v0.17.2-ubuntu22.04. The
	// driver's is a driver version (see DriverSpec).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`
	Version string `json:"version,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	PullPolicy corev1.PullPolicy `json:"pullPolicy,omitempty"`
	// PullSecrets are names of Secrets in Loom's namespace.
	// +optional
	// +listType=set
	PullSecrets []string `json:"pullSecrets,omitempty"`
}

// OperandSpec is what every operand DaemonSet shares.
type OperandSpec struct {
	// Enabled turns the operand on or off; each operand has its own default.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// +optional
	Image ImageSpec `json:"image,omitempty"`
	// Env is added to the operand's container; a variable Loom sets
	// (NODE_NAME, MIG_STRATEGY, KERNEL_MODULE_TYPE, ...) takes this value
	// instead. Each name at most once.
	// +optional
	// +listType=map
	// +listMapKey=name
	Env []corev1.EnvVar `json:"env,omitempty"`
	// +optional
	Args []string `json:"args,omitempty"`
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// Tolerations added to the shared ones.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// NodeSelector narrows the GPU nodes this operand runs on.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// DaemonSetsSpec holds settings every operand DaemonSet gets.
type DaemonSetsSpec struct {
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// PriorityClassName is every operand pod's PriorityClass.
	// +optional
	// +kubebuilder:default=system-node-critical
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// DrainSpec says how a node is drained before its driver is replaced.
type DrainSpec struct {
	// +optional
	Enable bool `json:"enable,omitempty"`
	// Force evicts pods not managed by a controller.
	// +optional
	Force bool `json:"force,omitempty"`
	// PodSelector limits the pods drained, in label selector syntax
	// (app=training,tier in (gpu,cpu),!canary); empty drains every pod. A
	// malformed one is rejected at apply (the rule is LabelSelectorPattern).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule=`self.matches('^[ \\t\\r\\n]*((![ \\t\\r\\n]*([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?|([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?([ \\t\\r\\n]*(==|=|!=)[ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?|[ \\t\\r\\n]*[<>][ \\t\\r\\n]*[0-9]{1,63}|[ \\t\\r\\n]+(in|notin)[ \\t\\r\\n]*[(][ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?[ \\t\\r\\n]*(,[ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?[ \\t\\r\\n]*)*[)])?)([ \\t\\r\\n]*,[ \\t\\r\\n]*(![ \\t\\r\\n]*([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?|([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?([ \\t\\r\\n]*(==|=|!=)[ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?|[ \\t\\r\\n]*[<>][ \\t\\r\\n]*[0-9]{1,63}|[ \\t\\r\\n]+(in|notin)[ \\t\\r\\n]*[(][ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?[ \\t\\r\\n]*(,[ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?[ \\t\\r\\n]*)*[)])?))*)?[ \\t\\r\\n]*$')`,message="drain.podSelector must be a label selector, e.g. app=training,tier in (gpu,cpu),!canary (keys and values of letters, digits, '-', '_' and '.', at most 63 characters; key in (v1,v2) needs a space before in)"
	PodSelector string `json:"podSelector,omitempty"`
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
	// +optional
	DeleteEmptyDir bool `json:"deleteEmptyDir,omitempty"`
}

// PodDeletionSpec says how the GPU pods on a node are removed before its
// driver is replaced (through the eviction API, so disruption budgets hold).
type PodDeletionSpec struct {
	// +optional
	Force bool `json:"force,omitempty"`
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
	// +optional
	DeleteEmptyDir bool `json:"deleteEmptyDir,omitempty"`
}

// WaitForCompletionSpec waits for matching pods to finish before a node's
// driver is replaced.
type WaitForCompletionSpec struct {
	// PodSelector selects the pods to wait for, in label selector syntax
	// (app=training,tier in (gpu,cpu),!canary); empty waits for none. A
	// malformed one is rejected at apply (the rule is LabelSelectorPattern).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule=`self.matches('^[ \\t\\r\\n]*((![ \\t\\r\\n]*([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?|([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?([ \\t\\r\\n]*(==|=|!=)[ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?|[ \\t\\r\\n]*[<>][ \\t\\r\\n]*[0-9]{1,63}|[ \\t\\r\\n]+(in|notin)[ \\t\\r\\n]*[(][ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?[ \\t\\r\\n]*(,[ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?[ \\t\\r\\n]*)*[)])?)([ \\t\\r\\n]*,[ \\t\\r\\n]*(![ \\t\\r\\n]*([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?|([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?([ \\t\\r\\n]*(==|=|!=)[ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?|[ \\t\\r\\n]*[<>][ \\t\\r\\n]*[0-9]{1,63}|[ \\t\\r\\n]+(in|notin)[ \\t\\r\\n]*[(][ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?[ \\t\\r\\n]*(,[ \\t\\r\\n]*([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?[ \\t\\r\\n]*)*[)])?))*)?[ \\t\\r\\n]*$')`,message="waitForCompletion.podSelector must be a label selector, e.g. app=training,tier in (gpu,cpu),!canary (keys and values of letters, digits, '-', '_' and '.', at most 63 characters; key in (v1,v2) needs a space before in)"
	PodSelector string `json:"podSelector,omitempty"`
	// TimeoutSeconds; 0 waits for ever.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// DriverUpgradePolicy governs rolling driver upgrades.
// +kubebuilder:validation:XValidation:rule="!has(self.maxUnavailable) || (type(self.maxUnavailable) == int ? int(self.maxUnavailable) >= 0 : string(self.maxUnavailable).matches('^(100|[1-9]?[0-9])%$'))",message="maxUnavailable must be a non-negative integer or a percentage from 0% to 100%"
// +kubebuilder:validation:XValidation:rule="!has(self.maxUnavailable) || (type(self.maxUnavailable) == int ? int(self.maxUnavailable) != 0 : string(self.maxUnavailable) != '0%')",message="maxUnavailable: 0 would never upgrade a node; set at least 1 (or 1%), or autoUpgrade: false to pause driver upgrades",fieldPath=".maxUnavailable"
type DriverUpgradePolicy struct {
	// AutoUpgrade lets Loom replace drivers node by node when the version
	// changes; off, a new version waits until a node's driver pod is deleted.
	// Pointers, so that a client that leaves them out (typed Go clients send
	// zero values) gets the defaults.
	// +optional
	// +kubebuilder:default=true
	AutoUpgrade *bool `json:"autoUpgrade,omitempty"`
	// MaxParallelUpgrades is how many nodes upgrade at once. 0 is unlimited
	// (as in GPU Operator), still bounded by maxUnavailable: it does not
	// pause upgrades (autoUpgrade: false does).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	MaxParallelUpgrades *int32 `json:"maxParallelUpgrades,omitempty"`
	// MaxUnavailable bounds the GPU nodes unavailable at once: a count of at
	// least 1, or a percentage from 1% to 100% of the GPU nodes, rounded up.
	// Nodes upgrading and nodes whose upgrade failed (they stay cordoned)
	// count against it. 0 (and 0%) is rejected at apply: it would never
	// upgrade a node; to pause upgrades set autoUpgrade: false. (A 0 stored
	// before this rule existed holds every upgrade, with the policy's
	// Ready condition False, reason InvalidSpec.)
	// +optional
	// +kubebuilder:default="25%"
	// +kubebuilder:validation:XIntOrString
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// MaxFailures is how many nodes may fail their upgrade to the driver
	// version they are being upgraded to before the rollout pauses: no
	// further node starts (the ClusterPolicy's DriverUpgrade condition is
	// False, reason UpgradePaused, naming the failed nodes) until a new
	// driver version is rolled out or the ClusterPolicy is annotated
	// gpu.loom.dev/driver-upgrade-resume (Loom then removes the annotation
	// and no longer counts the nodes failed so far). 0 never pauses:
	// only maxUnavailable bounds the failed nodes, which stay cordoned.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	MaxFailures *int32 `json:"maxFailures,omitempty"`
	// +optional
	WaitForCompletion *WaitForCompletionSpec `json:"waitForCompletion,omitempty"`
	// +optional
	PodDeletion *PodDeletionSpec `json:"podDeletion,omitempty"`
	// +optional
	Drain *DrainSpec `json:"drain,omitempty"`
}

// DriverSpec is the NVIDIA driver operand. Its image.version is a driver
// version (DriverVersionPattern): digits and dots such as 570.172.08 or
// 550.54.15, optionally with a suffix such as -ubuntu22.04 (the OS the
// image is built for); not a tag like latest.
// +kubebuilder:validation:XValidation:rule=`!has(self.image) || !has(self.image.version) || self.image.version.matches('^[0-9]+([.][0-9]+)+(-[A-Za-z0-9][A-Za-z0-9_.-]*)?$')`,message="driver.image.version must be a driver version such as 570.172.08 or 550.54.15, optionally with a suffix such as -ubuntu22.04 (not a tag such as latest)",fieldPath=".image.version"
// +kubebuilder:validation:XValidation:rule=`!has(self.usePrecompiled) || !self.usePrecompiled || !has(self.image) || !has(self.image.version) || !self.image.version.contains('-')`,message="driver.usePrecompiled takes the branch from image.version and the OS and kernel from each node: give a version without a suffix, e.g. 570.172.08",fieldPath=".usePrecompiled"
type DriverSpec struct {
	OperandSpec `json:",inline"`
	// KernelModuleType is which kernel modules the driver container loads:
	// auto (the driver picks per GPU), open (NVIDIA's open GPU kernel
	// modules) or proprietary. The container reads it as KERNEL_MODULE_TYPE.
	// +optional
	// +kubebuilder:default=auto
	// +kubebuilder:validation:Enum=auto;open;proprietary
	KernelModuleType string `json:"kernelModuleType,omitempty"`
	// UsePrecompiled runs precompiled driver images, tagged
	// <branch>-<kernel version>-<os> (570-5.15.0-105-generic-ubuntu22.04):
	// the branch is image.version's first number, the kernel each node's
	// status.nodeInfo.kernelVersion; one driver DaemonSet per OS and kernel.
	// +optional
	UsePrecompiled bool `json:"usePrecompiled,omitempty"`
	// +optional
	// +kubebuilder:default={}
	UpgradePolicy DriverUpgradePolicy `json:"upgradePolicy,omitempty"`
	// Manager is GPU Operator's driver manager, the driver pod's init
	// container: before a driver container starts on a node it stops the
	// node's operands and unloads the driver they held.
	// +optional
	Manager DriverManagerSpec `json:"manager,omitempty"`
}

// DriverManagerSpec is GPU Operator's k8s-driver-manager, run as the
// driver pod's init container (driver-manager uninstall_driver). Neither
// field is part of the driver's template hash: changing them restarts no
// driver, and the driver pods made from then on run the new manager.
type DriverManagerSpec struct {
	// Image; unset fields keep the built-in default
	// (nvcr.io/nvidia/cloud-native/k8s-driver-manager, DefaultDriverManagerImage).
	// +optional
	Image ImageSpec `json:"image,omitempty"`
	// Env is added to the manager's container; a variable Loom sets
	// (ENABLE_GPU_POD_EVICTION, ENABLE_AUTO_DRAIN, DRAIN_*, ...) takes this
	// value instead. Each name at most once.
	// +optional
	// +listType=map
	// +listMapKey=name
	Env []corev1.EnvVar `json:"env,omitempty"`
}

// TimeSlicingResource shares each device of a resource between replicas.
type TimeSlicingResource struct {
	// Name is the resource, nvidia.com/gpu or a MIG resource as the device
	// plugin advertises it: nvidia.com/mig-1g.10gb, and for a profile with
	// an extension (1g.10gb+me) its '+' written '.' (nvidia.com/mig-1g.10gb.me),
	// since a resource name cannot hold a '+'.
	// +kubebuilder:validation:MaxLength=74
	// +kubebuilder:validation:Pattern=`^nvidia\.com/(gpu|mig-[0-9]+g\.[0-9]+gb([.-][a-z]+)*)$`
	Name string `json:"name"`
	// Replicas each device is advertised as.
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=64
	Replicas int32 `json:"replicas"`
}

// TimeSlicingSpec configures GPU time-slicing.
type TimeSlicingSpec struct {
	// RenameByDefault advertises shared devices as <name>.shared.
	// +optional
	RenameByDefault bool `json:"renameByDefault,omitempty"`
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	Resources []TimeSlicingResource `json:"resources"`
}

// DevicePluginConfig selects the device plugin's sharing configuration:
// inline time-slicing, or a ConfigMap of named configs (nodes pick one with
// the nvidia.com/device-plugin.config label).
// +kubebuilder:validation:XValidation:rule="!(has(self.timeSlicing) && has(self.configMapName))",message="set either timeSlicing or configMapName, not both"
// +kubebuilder:validation:XValidation:rule="!has(self.defaultConfig) || has(self.configMapName)",message="defaultConfig names a key of configMapName, which is not set"
type DevicePluginConfig struct {
	// +optional
	TimeSlicing *TimeSlicingSpec `json:"timeSlicing,omitempty"`
	// ConfigMapName is a ConfigMap in Loom's namespace, one key per config;
	// each node runs the one its nvidia.com/device-plugin.config label
	// names (defaultConfig without it). An edit of its content restarts the
	// device plugins.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	ConfigMapName string `json:"configMapName,omitempty"`
	// DefaultConfig is the key used on nodes without the label.
	// +optional
	DefaultConfig string `json:"defaultConfig,omitempty"`
}

// DevicePluginSpec is the NVIDIA device plugin operand.
type DevicePluginSpec struct {
	OperandSpec `json:",inline"`
	// +optional
	Config *DevicePluginConfig `json:"config,omitempty"`
}

// MIGStrategy is how MIG devices are advertised.
// +kubebuilder:validation:Enum=none;single;mixed
type MIGStrategy string

const (
	MIGStrategyNone   MIGStrategy = "none"
	MIGStrategySingle MIGStrategy = "single"
	MIGStrategyMixed  MIGStrategy = "mixed"
)

// MIGSpec is the MIG strategy for the whole cluster.
type MIGSpec struct {
	// +optional
	// +kubebuilder:default=single
	Strategy MIGStrategy `json:"strategy,omitempty"`
}

// MIGManagerSpec is the MIG manager operand: it applies the MIG layout a
// node's nvidia.com/mig.config label names.
type MIGManagerSpec struct {
	OperandSpec `json:",inline"`
	// ConfigMapName is a ConfigMap in Loom's namespace holding the named MIG
	// layouts (mig-parted format, key config.yaml); empty uses Loom's
	// loom-mig-parted-config with GPU Operator's built-in layouts. An edit
	// of its content restarts the MIG managers.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	ConfigMapName string `json:"configMapName,omitempty"`
	// DefaultConfig is applied to nodes without a nvidia.com/mig.config
	// label; "all-disabled" leaves MIG off.
	// +optional
	// +kubebuilder:default=all-disabled
	DefaultConfig string `json:"defaultConfig,omitempty"`
}

// DCGMExporterSpec is the dcgm-exporter operand.
type DCGMExporterSpec struct {
	OperandSpec `json:",inline"`
	// MetricsConfigMapName holds the counters CSV (key dcgm-metrics.csv);
	// empty uses Loom's, which adds the ECC fields its alerts need.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	MetricsConfigMapName string `json:"metricsConfigMapName,omitempty"`
}

// ClusterPolicySpec is the desired GPU software stack. Every field has a
// default: spec: {} is a working stack.
// +kubebuilder:validation:XValidation:rule="!has(self.validator) || !has(self.validator.enabled) || self.validator.enabled || ((has(self.devicePlugin) && has(self.devicePlugin.enabled) && !self.devicePlugin.enabled) && !(has(self.dcgm) && has(self.dcgm.enabled) && self.dcgm.enabled) && (has(self.dcgmExporter) && has(self.dcgmExporter.enabled) && !self.dcgmExporter.enabled) && (has(self.migManager) && has(self.migManager.enabled) && !self.migManager.enabled) && !(has(self.nodeStatusExporter) && has(self.nodeStatusExporter.enabled) && self.nodeStatusExporter.enabled))",message="validator.enabled: false leaves the device plugin, DCGM, dcgm-exporter, the MIG manager and the node status exporter waiting for ever on every node for the toolkit-ready marker only the validator writes: keep the validator, or disable those too",fieldPath=".validator.enabled"
type ClusterPolicySpec struct {
	// +optional
	// +kubebuilder:default={}
	DaemonSets DaemonSetsSpec `json:"daemonsets,omitempty"`
	// +optional
	// +kubebuilder:default={}
	Driver DriverSpec `json:"driver,omitempty"`
	// +optional
	Toolkit OperandSpec `json:"toolkit,omitempty"`
	// Validator validates the toolkit on each node and writes the
	// toolkit-ready marker the operands after it (AfterToolkit) wait for:
	// it can be disabled only with them.
	// +optional
	Validator OperandSpec `json:"validator,omitempty"`
	// +optional
	DevicePlugin DevicePluginSpec `json:"devicePlugin,omitempty"`
	// DCGM is the standalone DCGM host engine (port 5555); off by default,
	// dcgm-exporter then embeds its own.
	// +optional
	DCGM OperandSpec `json:"dcgm,omitempty"`
	// +optional
	DCGMExporter DCGMExporterSpec `json:"dcgmExporter,omitempty"`
	// +optional
	// +kubebuilder:default={}
	MIG MIGSpec `json:"mig,omitempty"`
	// +optional
	// +kubebuilder:default={}
	MIGManager MIGManagerSpec `json:"migManager,omitempty"`
	// +optional
	NodeStatusExporter OperandSpec `json:"nodeStatusExporter,omitempty"`
	// Health is what Loom does about GPUs its node agents find unhealthy.
	// +optional
	Health GPUHealthSpec `json:"health,omitempty"`
}

// GPUHealthSpec is the optional remediation of unhealthy GPUs.
type GPUHealthSpec struct {
	// TaintUnhealthyNodes taints a node nvidia.com/gpu.unhealthy:NoSchedule
	// (value: the reason) while any of its GPUs is unhealthy (a critical Xid,
	// a pending row remap, a double-bit ECC error), so no new work lands on
	// it; the taint is lifted when its GPUs are healthy again, and put back
	// if removed by hand before (clear the GPU's health record, the
	// gpu.loom.dev/reset-gpu-health annotation on its GPUNode, or turn this
	// off to lift it). Off by default.
	// +optional
	TaintUnhealthyNodes bool `json:"taintUnhealthyNodes,omitempty"`
}

// ClusterPolicyState summarises a ClusterPolicy.
// +kubebuilder:validation:Enum=ready;notReady;ignored
type ClusterPolicyState string

const (
	PolicyReady    ClusterPolicyState = "ready"
	PolicyNotReady ClusterPolicyState = "notReady"
	PolicyIgnored  ClusterPolicyState = "ignored"
)

// ComponentStatus is one operand's rollout.
type ComponentStatus struct {
	// Name is the operand, e.g. driver, device-plugin.
	Name    string `json:"name"`
	Enabled bool   `json:"enabled"`
	// State is ready, notReady or disabled.
	State string `json:"state"`
	// Desired and Ready count the nodes the operand should run on and runs
	// ready on.
	// +optional
	Desired int32 `json:"desired"`
	// +optional
	Ready int32 `json:"ready"`
	// +optional
	Version string `json:"version,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// ClusterPolicyStatus is what the gpu reconciler observed.
type ClusterPolicyStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	State ClusterPolicyState `json:"state,omitempty"`
	// ActivePolicy names the ClusterPolicy in force when this one is ignored.
	// +optional
	ActivePolicy string `json:"activePolicy,omitempty"`
	// GPUNodes is the number of nodes with GPUs.
	// +optional
	GPUNodes int32 `json:"gpuNodes"`
	// +optional
	// +listType=map
	// +listMapKey=name
	Components []ComponentStatus `json:"components,omitempty"`
	// MIG is the actual MIG state of the GPU nodes, from their GPUNode
	// inventory.
	// +optional
	MIG *MIGSummary `json:"mig,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MIGSummary is the MIG state of the fleet as the node agents report it.
type MIGSummary struct {
	// Strategy is the policy's MIG strategy in force.
	Strategy MIGStrategy `json:"strategy"`
	// CapableNodes have MIG-capable GPUs.
	CapableNodes int32 `json:"capableNodes"`
	// EnabledNodes have at least one GPU in MIG mode.
	EnabledNodes int32 `json:"enabledNodes"`
	// PendingNodes have a GPU whose MIG mode changes at its next reset.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=20
	PendingNodes []string `json:"pendingNodes,omitempty"`
	// FailedNodes are nodes whose MIG manager reports
	// nvidia.com/mig.config.state=failed (at most 20 named).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=20
	FailedNodes []string `json:"failedNodes,omitempty"`
	// ConfigPending, ConfigSuccess and ConfigFailed count the GPU nodes by
	// the nvidia.com/mig.config.state their MIG manager reports (pending,
	// or rebooting to apply the layout; success; failed).
	// +optional
	ConfigPending int32 `json:"configPending,omitempty"`
	// +optional
	ConfigSuccess int32 `json:"configSuccess,omitempty"`
	// +optional
	ConfigFailed int32 `json:"configFailed,omitempty"`
	// FailureMessage is why the first failed node (by name) failed: the
	// layout it was asked for and, when its MIG manager says,
	// the gpu.loom.dev/mig-config-failure annotation.
	// +optional
	FailureMessage string `json:"failureMessage,omitempty"`
	// Devices counts the MIG devices of the cluster by profile.
	// +optional
	Devices map[string]int32 `json:"devices,omitempty"`
}

// ClusterPolicy is the desired GPU software stack of the cluster. Only one is
// in force (the oldest); others are marked ignored. Its name is the value of
// the gpu.loom.dev/clusterpolicy label on every operand object, so it has at
// most 63 characters.
// +kubebuilder:object:root=true
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="metadata.name must be at most 63 characters: it is the gpu.loom.dev/clusterpolicy label value of every operand object"
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=cp,categories=loom
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="Why the policy is (not) ready: the Ready condition's reason (kubectl loom why says more)"
// +kubebuilder:printcolumn:name="GPU Nodes",type=integer,JSONPath=`.status.gpuNodes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	// +kubebuilder:default={}
	Spec ClusterPolicySpec `json:"spec,omitempty"`
	// +optional
	Status ClusterPolicyStatus `json:"status,omitempty"`
}

// ClusterPolicyList is a list of ClusterPolicies.
// +kubebuilder:object:root=true
type ClusterPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterPolicy `json:"items"`
}
