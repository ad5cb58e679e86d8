package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types and reasons of a GPUNode.
const (
	// ConditionReady is True when the agent collected the inventory on its
	// last attempt.
	ConditionReady = "Ready"
	// ConditionNVMLUnavailable is True when NVML cannot be used on the node
	// (library missing, driver not loaded); its message is NVML's own error.
	ConditionNVMLUnavailable = "NVMLUnavailable"
	// ConditionReconciling (kstatus) is True while the agent has not yet read
	// the inventory through NVML, or is retrying after NVML or a collection
	// failed: it is expected to clear by itself (the driver is being
	// installed or replaced).
	ConditionReconciling = "Reconciling"
	// ConditionStalled (kstatus) is True when a GPU is unhealthy: no retry
	// fixes it; a person resets or replaces the GPU (see the health reset
	// annotation).
	ConditionStalled = "Stalled"
	// ConditionTruncated is True when the node reports more than the
	// status admits (a product name or version longer than its field, more
	// GPUs or MIG devices than a node holds): the agent writes what fits
	// (strings cut, the first devices kept) and its message names each
	// field cut. It is absent otherwise.
	ConditionTruncated = "Truncated"

	ReasonCollected        = "Collected"
	ReasonNVMLInitFailed   = "NVMLInitFailed"
	ReasonCollectionFailed = "CollectionFailed"
	ReasonNVMLAvailable    = "NVMLAvailable"
	ReasonUnhealthyGPUs    = "UnhealthyGPUs"
	// ReasonAllHealthy: Stalled is False, every GPU read is healthy.
	ReasonAllHealthy = "AllHealthy"
	// ReasonNVMLLost: NVML worked, then its calls began failing (the driver
	// was unloaded, e.g. for an upgrade). The agent keeps the last inventory.
	ReasonNVMLLost = "NVMLLost"
	// ReasonUnprivileged: NVML could not be initialised and the agent runs
	// unprivileged (the chart's nodeAgent.privileged=false), without the
	// GPUs' device nodes: a configuration, not a driver missing. The agent
	// reports the PCI bus only, its GPUs' health unwatched, and keeps
	// trying NVML (NVIDIA's runtime as the node's default gives it the
	// devices).
	ReasonUnprivileged = "Unprivileged"

	// Reasons of the Truncated condition: what its first cut was.
	ReasonTooManyGPUs       = "TooManyGPUs"
	ReasonTooManyMIGDevices = "TooManyMIGDevices"
	ReasonTooManyPCIDevices = "TooManyPCIDevices"
	ReasonValueTooLong      = "ValueTooLong"
	ReasonNegativeValue     = "NegativeValue"
)

// Reasons of an unhealthy GPU (GPUHealth.Reason).
const (
	// HealthXidCriticalError: the driver reported a critical Xid.
	HealthXidCriticalError = "XidCriticalError"
	// HealthDoubleBitECC: uncorrectable (double-bit) ECC errors, from an
	// event or the volatile counter.
	HealthDoubleBitECC = "DoubleBitECC"
	// HealthRowRemapPending: a memory row remap waits for the next GPU
	// reset; it clears when NVML no longer reports it.
	HealthRowRemapPending = "RowRemapPending"
	// HealthRowRemapFailure: row remapping failed (no spare rows left); the
	// GPU needs replacing.
	HealthRowRemapFailure = "RowRemapFailure"
	// HealthGPULost: NVML answers that the GPU has fallen off the bus; it
	// clears when the GPU is read again.
	HealthGPULost = "GPULost"
	// HealthUnreadable: another NVML error on one GPU's calls; it clears
	// when the GPU is read again.
	HealthUnreadable = "GPUUnreadable"
)

// AnnotationResetGPUHealth on a GPUNode asks its agent to forget what it
// knows of its GPUs' health: "all", or comma-separated GPU UUIDs. The agent
// clears those GPUs' Unhealthy state (a condition that is still there comes
// back at the next collection) and then removes the annotation.
const AnnotationResetGPUHealth = "gpu.loom.dev/reset-gpu-health"

// GPUHealthState says whether a GPU can take work.
// +kubebuilder:validation:Enum=Healthy;Unhealthy
type GPUHealthState string

const (
	GPUHealthy   GPUHealthState = "Healthy"
	GPUUnhealthy GPUHealthState = "Unhealthy"
)

// MIGMode is a GPU's Multi-Instance GPU mode.
// +kubebuilder:validation:Enum=Enabled;Disabled
type MIGMode string

const (
	MIGEnabled  MIGMode = "Enabled"
	MIGDisabled MIGMode = "Disabled"
)

// DriverSource is where the driver the agent reads the GPUs through comes
// from.
// +kubebuilder:validation:Enum=Host;Container
type DriverSource string

const (
	// DriverHost: the host's own driver, installed outside Kubernetes (NVML
	// loaded from the host's root, no containerised driver's root there).
	DriverHost DriverSource = "Host"
	// DriverContainer: a containerised driver's (Loom's driver operand,
	// GPU Operator's), NVML loaded from its root at /run/nvidia/driver.
	DriverContainer DriverSource = "Container"
)

// GPUDriver is the driver the agent reads the GPUs through.
type GPUDriver struct {
	// Source is where the driver comes from: Host or Container. The GPU
	// labeller marks a node whose driver is the host's, and on which no
	// driver pod of Loom's is ready, nvidia.com/gpu.deploy.driver=pre-installed,
	// which keeps Loom's driver off it.
	Source DriverSource `json:"source"`
}

// GPUHealth is a GPU's health as the agent last saw it.
type GPUHealth struct {
	State GPUHealthState `json:"state"`
	// Reason is a CamelCase cause when unhealthy, e.g. XidCriticalError.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`
	// Message explains the reason, e.g. "Xid 79: GPU has fallen off the bus".
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// Xid is the last critical Xid error code seen on this GPU, if any.
	// +optional
	Xid int64 `json:"xid,omitempty"`
	// Since is when the GPU became unhealthy (unset while healthy). An
	// unhealthy GPU stays unhealthy across agent restarts until it is reset
	// (its UUID leaves NVML's list and comes back) or a person clears it
	// with the gpu.loom.dev/reset-gpu-health annotation.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
}

// PCIDevice is an NVIDIA GPU as the node's PCI bus shows it (sysfs), with no
// driver needed.
type PCIDevice struct {
	// BusID is the PCI address, e.g. 0000:18:00.0.
	// +kubebuilder:validation:MaxLength=64
	BusID string `json:"busID"`
	// DeviceID is the PCI device ID, e.g. 0x2330.
	// +kubebuilder:validation:MaxLength=64
	DeviceID string `json:"deviceID"`
	// Class is the PCI class, e.g. 0x030200 (3D controller).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Class string `json:"class,omitempty"`
	// Product is the product name when the device ID is known, e.g.
	// "NVIDIA H100 80GB HBM3".
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Product string `json:"product,omitempty"`
}

// MIGDevice is one MIG device (a GPU instance with a compute instance).
type MIGDevice struct {
	// Profile is the MIG profile name, e.g. 1g.10gb.
	// +kubebuilder:validation:MaxLength=64
	Profile string `json:"profile"`
	// +optional
	// +kubebuilder:validation:MaxLength=256
	UUID string `json:"uuid,omitempty"`
	// +kubebuilder:validation:Minimum=0
	MemoryMiB int64 `json:"memoryMiB"`
	// +kubebuilder:validation:Minimum=0
	GPUInstanceID int32 `json:"gpuInstanceID"`
	// +kubebuilder:validation:Minimum=0
	ComputeInstanceID int32 `json:"computeInstanceID"`
}

// MIGStatus is a GPU's MIG capability, mode and devices.
type MIGStatus struct {
	Capable bool `json:"capable"`
	// +optional
	CurrentMode MIGMode `json:"currentMode,omitempty"`
	// PendingMode differs from CurrentMode until the GPU is reset.
	// +optional
	PendingMode MIGMode `json:"pendingMode,omitempty"`
	// A GPU has at most 7 GPU instances, each of at most 8 compute
	// instances.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Devices []MIGDevice `json:"devices,omitempty"`
}

// GPU is one physical GPU.
type GPU struct {
	// Index is NVML's device index.
	// +kubebuilder:validation:Minimum=0
	Index int32 `json:"index"`
	// +kubebuilder:validation:MaxLength=256
	UUID string `json:"uuid"`
	// Product is NVML's device name, e.g. "NVIDIA H100 80GB HBM3".
	// +kubebuilder:validation:MaxLength=256
	Product string `json:"product"`
	// Architecture, e.g. Hopper.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Architecture string `json:"architecture,omitempty"`
	// MemoryMiB is the framebuffer size.
	// +kubebuilder:validation:Minimum=0
	MemoryMiB int64 `json:"memoryMiB"`
	// ComputeCapability is the CUDA compute capability, e.g. "9.0".
	// +optional
	// +kubebuilder:validation:MaxLength=64
	ComputeCapability string `json:"computeCapability,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=64
	PCIBusID string `json:"pciBusID,omitempty"`
	// +optional
	MIG    *MIGStatus `json:"mig,omitempty"`
	Health GPUHealth  `json:"health"`
}

// GPUNodeStatus is the NVML inventory of the node. Only what changes when
// hardware, driver or configuration change belongs here; temperatures and
// utilisation are metrics.
type GPUNodeStatus struct {
	// +optional
	// +kubebuilder:validation:MaxLength=128
	DriverVersion string `json:"driverVersion,omitempty"`
	// CUDADriverVersion is the CUDA version the driver supports, e.g. "12.4".
	// +optional
	// +kubebuilder:validation:MaxLength=128
	CUDADriverVersion string `json:"cudaDriverVersion,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=128
	NVMLVersion string `json:"nvmlVersion,omitempty"`
	// Driver is where the driver NVML was loaded from comes from; unset
	// when the agent cannot tell (NVML found by the dynamic loader, a
	// --driver-root of its own, a simulation) or has not read NVML yet.
	// +optional
	Driver *GPUDriver `json:"driver,omitempty"`
	// GPUCount is the number of physical GPUs.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	GPUCount int32 `json:"gpuCount"`
	// Product is the GPUs' product name, or "mixed" when they differ.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Product string `json:"product,omitempty"`
	// MIG summarises the GPUs' MIG modes: Enabled, Disabled or Mixed.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	MIG string `json:"mig,omitempty"`
	// Simulated names the simulated system (e.g. dgx-h100) when the agent
	// runs in simulation mode; empty on real hardware.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Simulated string `json:"simulated,omitempty"`
	// PCIDevices are the node's NVIDIA GPUs on the PCI bus, read without the
	// driver: they say the node has GPUs before NVML can.
	// +optional
	// +listType=map
	// +listMapKey=busID
	// +kubebuilder:validation:MaxItems=64
	PCIDevices []PCIDevice `json:"pciDevices,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=index
	// +kubebuilder:validation:MaxItems=64
	GPUs []GPU `json:"gpus,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// GPUNode is the GPU inventory of one node, as the node agent reads it
// through NVML. Its name is the node's name; it is owned by the Node.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=gpun,categories=loom
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.status.gpuCount`
// +kubebuilder:printcolumn:name="Product",type=string,JSONPath=`.status.product`
// +kubebuilder:printcolumn:name="Driver",type=string,JSONPath=`.status.driverVersion`
// +kubebuilder:printcolumn:name="Driver Source",type=string,JSONPath=`.status.driver.source`,priority=1
// +kubebuilder:printcolumn:name="MIG",type=string,JSONPath=`.status.mig`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GPUNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Status GPUNodeStatus `json:"status,omitempty"`
}

// GPUNodeList is a list of GPUNodes.
// +kubebuilder:object:root=true
type GPUNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GPUNode `json:"items"`
}
