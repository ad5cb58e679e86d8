package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Framework names the distributed-training framework whose rendezvous
// environment the pods get.
// +kubebuilder:validation:Enum=PyTorch
type Framework string

// FrameworkPyTorch: torchrun/torch.distributed (MASTER_ADDR, WORLD_SIZE,
// RANK and the PET_* set).
const FrameworkPyTorch Framework = "PyTorch"

// Role is a replica type. Pod names and labels use it in lower case.
type Role string

const (
	// RoleMaster is rank 0 and decides the job's success.
	RoleMaster Role = "master"
	// RoleWorker is ranks 1..n.
	RoleWorker Role = "worker"
)

// ReplicaSpec is one role's pods.
// +kubebuilder:validation:XValidation:rule="size(self.template.spec.containers) > 0",message="template.spec.containers must list at least one container"
// +kubebuilder:validation:XValidation:rule="!has(self.template.spec.restartPolicy) || self.template.spec.restartPolicy == 'Never'",message="template.spec.restartPolicy must be Never or unset: Loom restarts the whole gang on a retryable failure instead of restarting single containers"
// +kubebuilder:validation:XValidation:rule="!has(self.template.spec.nodeName) || size(self.template.spec.nodeName) == 0",message="template.spec.nodeName must not be set: it binds the pod past the scheduler and the gang; use nodeSelector or affinity"
// +kubebuilder:validation:XValidation:rule="self.template.spec.containers.all(c, !has(c.resources) || ((!has(c.resources.requests) || c.resources.requests.all(k, !k.startsWith('nvidia.com/') || quantity(string(c.resources.requests[k])).isInteger())) && (!has(c.resources.limits) || c.resources.limits.all(k, !k.startsWith('nvidia.com/') || quantity(string(c.resources.limits[k])).isInteger()))))",message="template.spec.containers[*].resources: nvidia.com/gpu and every other nvidia.com/* request and limit must be whole numbers: a pod gets whole GPUs (use a MIG profile's resource, e.g. nvidia.com/mig-1g.10gb, for a slice)"
// +kubebuilder:validation:XValidation:rule="!has(self.template.spec.initContainers) || self.template.spec.initContainers.all(c, !has(c.resources) || ((!has(c.resources.requests) || c.resources.requests.all(k, !k.startsWith('nvidia.com/') || quantity(string(c.resources.requests[k])).isInteger())) && (!has(c.resources.limits) || c.resources.limits.all(k, !k.startsWith('nvidia.com/') || quantity(string(c.resources.limits[k])).isInteger()))))",message="template.spec.initContainers[*].resources: nvidia.com/gpu and every other nvidia.com/* request and limit must be whole numbers: a pod gets whole GPUs (use a MIG profile's resource, e.g. nvidia.com/mig-1g.10gb, for a slice)"
// +kubebuilder:validation:XValidation:rule="!has(self.template.spec.resources) || ((!has(self.template.spec.resources.requests) || self.template.spec.resources.requests.all(k, !k.startsWith('nvidia.com/') || quantity(string(self.template.spec.resources.requests[k])).isInteger())) && (!has(self.template.spec.resources.limits) || self.template.spec.resources.limits.all(k, !k.startsWith('nvidia.com/') || quantity(string(self.template.spec.resources.limits[k])).isInteger())))",message="template.spec.resources: nvidia.com/gpu and every other nvidia.com/* request and limit must be whole numbers: a pod gets whole GPUs (use a MIG profile's resource, e.g. nvidia.com/mig-1g.10gb, for a slice)"
type ReplicaSpec struct {
	// Replicas is the number of pods of this role. A job whose pods (the
	// master and the workers) exceed the manager's --max-workload-pods
	// (default 5000) is held without pods, its Ready condition saying
	// TooManyPods.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9999
	Replicas *int32 `json:"replicas,omitempty"`
	// Template is the pod template. Loom adds the rendezvous environment,
	// the pod's hostname and subdomain, its labels and, with Volcano, the
	// gang's scheduler name and annotations. It must not set nodeName (the
	// gang is placed by its scheduler); nvidia.com/* requests and limits are
	// whole numbers; at most 64 containers and 64 init containers, 64
	// resources per requests or limits, 64 characters per quantity.
	Template corev1.PodTemplateSpec `json:"template"`
}

// ReplicaSpecs are the job's roles.
type ReplicaSpecs struct {
	// Master is rank 0: exactly one pod. The job succeeds when it exits 0.
	Master ReplicaSpec `json:"master"`
	// Worker pods are ranks 1..replicas.
	// +optional
	Worker *ReplicaSpec `json:"worker,omitempty"`
}

// PyTorchSpec tunes the PyTorch rendezvous.
type PyTorchSpec struct {
	// NprocPerNode is torchrun's --nproc-per-node (PET_NPROC_PER_NODE): a
	// number, or auto, cpu or gpu. Unset: the number of GPUs each pod's
	// containers request, or auto for pods without GPUs.
	// +optional
	// +kubebuilder:validation:Pattern=`^(auto|cpu|gpu|[1-9][0-9]{0,3})$`
	NprocPerNode string `json:"nprocPerNode,omitempty"`
	// MasterPort is the rendezvous port on the master (MASTER_PORT).
	// +optional
	// +kubebuilder:default=23456
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	MasterPort int32 `json:"masterPort,omitempty"`
}

// CleanPodPolicy says which pods to delete once the job has finished.
// +kubebuilder:validation:Enum=All;Running;None
type CleanPodPolicy string

const (
	// CleanPodAll deletes every pod.
	CleanPodAll CleanPodPolicy = "All"
	// CleanPodRunning deletes the pods still running, so that they stop
	// holding GPUs, and keeps finished ones for their logs.
	CleanPodRunning CleanPodPolicy = "Running"
	// CleanPodNone keeps every pod.
	CleanPodNone CleanPodPolicy = "None"
)

// RunPolicy governs the job's lifetime.
type RunPolicy struct {
	// BackoffLimit is how many whole-gang restarts a retryable failure may
	// cause before the job fails. Restarts caused by a disruption (a pod
	// with the DisruptionTarget condition: preempted, evicted, deleted by
	// the taint manager or the pod garbage collector on a lost node; or a
	// pod of the running gang deleted or gone) do not count: they are
	// status.disruptions.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	BackoffLimit *int32 `json:"backoffLimit,omitempty"`
	// ActiveDeadlineSeconds bounds the time from the job's (or, after a
	// suspension, its resumption's) start; past it the job fails. At most
	// 315360000 (ten years; MaxSeconds).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=315360000
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`
	// TTLSecondsAfterFinished deletes the job (and so its pods) this long
	// after it succeeded or failed. Unset: keep it. At most 315360000 (ten
	// years; MaxSeconds).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=315360000
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
	// CleanPodPolicy: which pods to delete when the job finishes.
	// +optional
	// +kubebuilder:default=Running
	CleanPodPolicy CleanPodPolicy `json:"cleanPodPolicy,omitempty"`
	// Suspend deletes the job's pods and PodGroup and keeps it until unset;
	// resuming starts the gang afresh (not counted as a restart).
	// +optional
	Suspend bool `json:"suspend,omitempty"`
}

// GangScheduler names who places the gang.
// +kubebuilder:validation:Enum=volcano;none
type GangScheduler string

const (
	// GangVolcano: a Volcano PodGroup admits the pods all at once.
	GangVolcano GangScheduler = "volcano"
	// GangNone: the pods go to the pod template's scheduler, one by one.
	GangNone GangScheduler = "none"
)

// NeverFitsPolicy says what to do with a gang that can never fit the cluster.
// +kubebuilder:validation:Enum=Wait;Fail
type NeverFitsPolicy string

const (
	// NeverFitsWait keeps the job pending (the cluster may grow) with a
	// condition saying why.
	NeverFitsWait NeverFitsPolicy = "Wait"
	// NeverFitsFail fails the job at once.
	NeverFitsFail NeverFitsPolicy = "Fail"
)

// GangPolicy is how the pods are scheduled together.
type GangPolicy struct {
	// Scheduler: volcano or none. Unset: the manager's --gang-scheduler.
	// +optional
	Scheduler GangScheduler `json:"scheduler,omitempty"`
	// Queue is the Volcano queue: the name of a Volcano Queue object.
	// +optional
	// +kubebuilder:default=default
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Queue string `json:"queue,omitempty"`
	// PriorityClassName is the gang's priority (PodGroup and pods): the
	// name of a PriorityClass.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// MinAvailable is how many pods must be placed together (master first).
	// Unset: every pod.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MinAvailable *int32 `json:"minAvailable,omitempty"`
	// WhenNeverFits: Wait (default) keeps a gang that this cluster can never
	// hold pending with a condition saying so; Fail fails it at once.
	// +optional
	// +kubebuilder:default=Wait
	WhenNeverFits NeverFitsPolicy `json:"whenNeverFits,omitempty"`
}

// ExitCodeRange is an inclusive range of container exit codes.
// +kubebuilder:validation:XValidation:rule="!has(self.max) || self.max >= self.min",message="max must not be below min"
type ExitCodeRange struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	Min int32 `json:"min"`
	// Max defaults to Min.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	Max *int32 `json:"max,omitempty"`
}

// FailurePolicy decides which failures restart the gang.
type FailurePolicy struct {
	// RetryableExitCodes are the container exit codes that restart the whole
	// gang (signals: 128+n, e.g. 137 for SIGKILL or an OOM kill). Any other
	// non-zero exit code fails the job. Evicted, preempted or lost pods are
	// always retryable. Default: 128-255.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	RetryableExitCodes []ExitCodeRange `json:"retryableExitCodes,omitempty"`
}

// TrainingJobSpec is a distributed training job.
// +kubebuilder:validation:XValidation:rule="self.replicaSpecs == oldSelf.replicaSpecs || (has(oldSelf.runPolicy) && has(oldSelf.runPolicy.suspend) && oldSelf.runPolicy.suspend)",message="replicaSpecs can change only while the job is suspended (runPolicy.suspend: true before the change, which may also be the update that resumes it, as Kueue's admission does): a running gang cannot change its size or pods"
// +kubebuilder:validation:XValidation:rule="(has(oldSelf.runPolicy) && has(oldSelf.runPolicy.suspend) && oldSelf.runPolicy.suspend) || ((has(self.framework) ? self.framework : 'PyTorch') == (has(oldSelf.framework) ? oldSelf.framework : 'PyTorch') && (has(self.pytorch) && has(self.pytorch.masterPort) ? self.pytorch.masterPort : 23456) == (has(oldSelf.pytorch) && has(oldSelf.pytorch.masterPort) ? oldSelf.pytorch.masterPort : 23456) && (has(self.pytorch) && has(self.pytorch.nprocPerNode)) == (has(oldSelf.pytorch) && has(oldSelf.pytorch.nprocPerNode)) && (!has(self.pytorch) || !has(self.pytorch.nprocPerNode) || self.pytorch.nprocPerNode == oldSelf.pytorch.nprocPerNode))",message="framework and pytorch (masterPort, nprocPerNode) can change only while the job is suspended, as replicaSpecs: every pod of a gang carries them (MASTER_PORT, WORLD_SIZE, PET_NPROC_PER_NODE), and pods built before and after the change would not agree"
// +kubebuilder:validation:XValidation:rule="!has(self.replicaSpecs.master.replicas) || self.replicaSpecs.master.replicas == 1",message="replicaSpecs.master.replicas must be 1: a job has exactly one master (rank 0)"
// +kubebuilder:validation:XValidation:rule="!has(self.gang) || !has(self.gang.minAvailable) || self.gang.minAvailable <= 1 + (has(self.replicaSpecs.worker) && has(self.replicaSpecs.worker.replicas) ? self.replicaSpecs.worker.replicas : 0)",message="gang.minAvailable exceeds the job's pods (one master plus replicaSpecs.worker.replicas)"
type TrainingJobSpec struct {
	// Framework decides the rendezvous environment. Default: PyTorch.
	// +optional
	// +kubebuilder:default=PyTorch
	Framework Framework `json:"framework,omitempty"`
	// PyTorch tunes the PyTorch rendezvous.
	// +optional
	PyTorch *PyTorchSpec `json:"pytorch,omitempty"`
	// ReplicaSpecs are the master and the workers.
	ReplicaSpecs ReplicaSpecs `json:"replicaSpecs"`
	// +optional
	RunPolicy RunPolicy `json:"runPolicy,omitempty"`
	// +optional
	Gang GangPolicy `json:"gang,omitempty"`
	// +optional
	FailurePolicy FailurePolicy `json:"failurePolicy,omitempty"`
}

// JobState is the one-word summary of a job.
type JobState string

const (
	// StateHeld: Loom cannot create the gang yet (e.g. Volcano is missing).
	StateHeld JobState = "Held"
	// StatePending: the gang is being created or waits to be scheduled.
	StatePending JobState = "Pending"
	// StateRunning: every pod of the gang runs.
	StateRunning JobState = "Running"
	// StateRestarting: a retryable failure is restarting the whole gang.
	StateRestarting JobState = "Restarting"
	// StateSuspended: spec.runPolicy.suspend holds the job without pods.
	StateSuspended JobState = "Suspended"
	// StateSucceeded: the master exited 0.
	StateSucceeded JobState = "Succeeded"
	// StateFailed: a permanent failure, the backoff limit or the deadline.
	StateFailed JobState = "Failed"
)

// Condition types of a TrainingJob. Ready is True while the gang runs and
// once it has succeeded. Reconciling and Stalled are kstatus's (Helm's
// --wait, Flux, cli-utils): Reconciling is True while Loom still works
// towards a running gang (creating pods, waiting for the gang to be
// placed, restarting it), Stalled is True when only a person can move the
// job on (a spec Loom refuses, a failed job), which kstatus reads as
// Failed.
const (
	ConditionCreated     = "Created"
	ConditionScheduled   = "Scheduled"
	ConditionRunning     = "Running"
	ConditionRestarting  = "Restarting"
	ConditionSucceeded   = "Succeeded"
	ConditionFailed      = "Failed"
	ConditionSuspended   = "Suspended"
	ConditionReady       = "Ready"
	ConditionReconciling = "Reconciling"
	ConditionStalled     = "Stalled"
)

// ReplicaStatus counts one role's pods of the current attempt.
type ReplicaStatus struct {
	// Active pods are pending or running.
	// +optional
	Active int32 `json:"active,omitempty"`
	// +optional
	Succeeded int32 `json:"succeeded,omitempty"`
	// +optional
	Failed int32 `json:"failed,omitempty"`
}

// ReplicaStatuses are the per-role counts.
type ReplicaStatuses struct {
	// +optional
	Master ReplicaStatus `json:"master,omitempty"`
	// +optional
	Worker ReplicaStatus `json:"worker,omitempty"`
}

// TrainingJobStatus is what the training reconciler observed.
type TrainingJobStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	State JobState `json:"state,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// +optional
	ReplicaStatuses ReplicaStatuses `json:"replicaStatuses,omitempty"`
	// Workers is the number of worker pods the job runs.
	// +optional
	Workers int32 `json:"workers"`
	// GPUs is the number of nvidia.com/gpu the whole gang requests.
	// +optional
	GPUs int64 `json:"gpus"`
	// Restarts counts whole-gang restarts, disruptions included.
	// +optional
	Restarts int32 `json:"restarts"`
	// Disruptions counts the restarts caused by a disruption rather than
	// by a failure of the job's own: they do not count against
	// runPolicy.backoffLimit.
	// +optional
	Disruptions int32 `json:"disruptions,omitempty"`
	// Attempt numbers the current gang; pods carry it in the
	// training.loom.dev/attempt label. It grows with every restart and every
	// resumption.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// Scheduler is the gang scheduler in effect (spec or manager default).
	// +optional
	Scheduler GangScheduler `json:"scheduler,omitempty"`
	// StartTime is when the current run (first attempt, or resumption) began.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when the job succeeded or failed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// TrainingJob is a gang-scheduled distributed training job: one master and
// any number of workers, restarted as a whole on a retryable failure.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tj,categories=loom
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="Why the job is (not) ready: the Ready condition's reason (kubectl loom why says more)"
// +kubebuilder:printcolumn:name="Workers",type=integer,JSONPath=`.status.workers`
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.status.gpus`
// +kubebuilder:printcolumn:name="Restarts",type=integer,JSONPath=`.status.restarts`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 50",message="a TrainingJob's name must be a DNS-1035 label (lower case letters, digits and '-', starting with a letter) of at most 50 characters: it names the job's Service and is the prefix of its pods' hostnames"
type TrainingJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec TrainingJobSpec `json:"spec"`
	// +optional
	Status TrainingJobStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// TrainingJobList is a list of TrainingJobs.
type TrainingJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TrainingJob `json:"items"`
}
