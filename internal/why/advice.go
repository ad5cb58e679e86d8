package why

import (
	"fmt"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/sharing"
)

// The condition reasons Loom's reconcilers set, as they spell them (a test
// of cmd/kubectl-loom holds them equal to the reconcilers' constants).
const (
	// TrainingJob (training reconciler).
	ReasonCreateFailed        = "CreateFailed"
	ReasonVolcanoNotInstalled = "VolcanoNotInstalled"
	ReasonGangPending         = "GangPending"
	ReasonGangInqueue         = "GangInqueue"
	ReasonPodsPending         = "PodsPending"
	ReasonNeverFits           = "NeverFits"
	ReasonNotEnoughGPUs       = "NotEnoughGPUs"
	ReasonWaitingForPods      = "WaitingForPods"
	ReasonRetryableFailure    = "RetryableFailure"
	ReasonPermanentFailure    = "PermanentFailure"
	ReasonBackoffLimit        = "BackoffLimitExceeded"
	ReasonDeadlineExceeded    = "DeadlineExceeded"
	ReasonSuspended           = "Suspended"
	ReasonTooManyPods         = "TooManyPods"
	ReasonNameConflict        = "NameConflict"
	ReasonWorkloadDeactivated = "WorkloadDeactivated"
	ReasonQueueNameMissing    = "QueueNameMissing"
	ReasonQueuedInKueue       = "QueuedInKueue"
	ReasonEvictedByKueue      = "EvictedByKueue"
	// Volcano queues (internal/gang).
	ReasonQueueNotFound = "QueueNotFound"
	ReasonQueueClosed   = "QueueClosed"
	// ClusterPolicy Ready (clusterpolicy reconciler).
	ReasonComponentsWait = "ComponentsNotReady"
	ReasonNoGPUNodes     = "NoGPUNodes"
	ReasonIgnored        = "AnotherPolicyActive"
	ReasonApplyFailed    = "ApplyFailed"
	ReasonInvalidSpec    = "InvalidSpec"
	// RayCluster ReplicaFailure (raycluster reconciler).
	ReasonFailedToApply = "FailedToApply"
)

const managerLogs = "kubectl logs -n <loom namespace> deploy/loom-manager"

// trainingAdvice is what to do about a TrainingJob's reason.
func trainingAdvice(reason string, tj *trainingv1alpha1.TrainingJob, names sharing.Names) string {
	pods := fmt.Sprintf("kubectl get pods -n %s -l %s=%s", tj.Namespace, trainingv1alpha1.LabelJobName, tj.Name)
	queue := tj.Spec.Queue()
	switch reason {
	case ReasonNeverFits:
		res, per, product := jobGPUs(tj, names)
		with := "more " + res + " per node"
		if product != "" {
			with = product + " GPUs"
		}
		if res == "" {
			return "reduce replicas or GPUs per pod, or add GPU nodes"
		}
		return fmt.Sprintf("reduce replicas or GPUs per pod (now %d %s), or add nodes with %s", per, res, with)
	case ReasonNotEnoughGPUs:
		return "wait for GPUs to free up (kubectl loom gpus -o wide shows which pods hold them), or reduce replicas or GPUs per pod"
	case ReasonQueueNotFound:
		return fmt.Sprintf("create the Volcano queue %q (kubectl get queues.scheduling.volcano.sh), or set spec.gang.queue to one that exists", queue)
	case ReasonQueueClosed:
		return fmt.Sprintf("open the Volcano queue %q again, or set spec.gang.queue to an open one", queue)
	case ReasonVolcanoNotInstalled:
		return "install Volcano, or set spec.gang.scheduler: none to schedule the pods one by one"
	case ReasonGangPending, ReasonGangInqueue:
		return fmt.Sprintf("Volcano has not admitted or placed the whole gang: check queue %q's capacity (kubectl get queues.scheduling.volcano.sh %s -o yaml) and the PodGroup (kubectl get podgroups -n %s %s -o yaml)",
			queue, queue, tj.Namespace, tj.Name)
	case ReasonPodsPending, ReasonWaitingForPods:
		return "look at the pods' events: " + pods + ", then kubectl describe pod <pod>"
	case ReasonTooManyPods:
		return "reduce spec.replicaSpecs.worker.replicas, or raise the manager's --max-workload-pods"
	case ReasonCreateFailed:
		return "fix what the message names (a missing PriorityClass, a quota, an admission webhook); Loom retries on its own"
	case ReasonNameConflict:
		return "rename the job, or delete the object that holds the name (it is not the job's)"
	case ReasonBackoffLimit, ReasonRetryableFailure:
		return "read the failed pods' logs (kubectl logs -n " + tj.Namespace + " <pod>); raise spec.runPolicy.backoffLimit if the failure is transient"
	case ReasonPermanentFailure:
		return "read the failed pod's logs (kubectl logs -n " + tj.Namespace + " <pod>): its exit code is permanent under spec.failurePolicy"
	case ReasonDeadlineExceeded:
		return "raise spec.runPolicy.activeDeadlineSeconds, or make the job shorter"
	case ReasonWorkloadDeactivated:
		return fmt.Sprintf("once what the message names is dealt with, reactivate the job's Kueue Workload: kubectl patch workload -n %s %s --type merge -p '{\"spec\":{\"active\":true}}'",
			tj.Namespace, workloadOf(tj))
	case ReasonQueuedInKueue:
		return fmt.Sprintf("the job starts once Kueue admits its Workload: kubectl get workload -n %s %s -o yaml says what quota it waits for", tj.Namespace, workloadOf(tj))
	case ReasonEvictedByKueue:
		return fmt.Sprintf("Kueue evicted or preempted the job; it resumes by itself when Kueue admits it again (kubectl get workload -n %s %s -o yaml)", tj.Namespace, workloadOf(tj))
	case ReasonInvalidSpec:
		return fmt.Sprintf("fix what the message names (kubectl edit trainingjob -n %s %s); a pod template changes only while the job is suspended (spec.runPolicy.suspend)", tj.Namespace, tj.Name)
	case ReasonQueueNameMissing:
		return fmt.Sprintf("name the job's Kueue LocalQueue (kubectl get localqueues -n %s): kubectl label trainingjob -n %s %s kueue.x-k8s.io/queue-name=<LocalQueue>",
			tj.Namespace, tj.Namespace, tj.Name)
	case ReasonSuspended:
		return fmt.Sprintf("kubectl patch trainingjob -n %s %s --type merge -p '{\"spec\":{\"runPolicy\":{\"suspend\":false}}}' to resume", tj.Namespace, tj.Name)
	case "NoStatus":
		return ""
	}
	return ""
}

// workloadOf is the name of a TrainingJob's Kueue Workload.
func workloadOf(tj *trainingv1alpha1.TrainingJob) string {
	return kueue.WorkloadName(tj.Name, tj.UID, trainingv1alpha1.GroupVersion.WithKind("TrainingJob"))
}

// policyAdvice is what to do about a ClusterPolicy's reason.
func policyAdvice(reason string, cp *gpuv1alpha1.ClusterPolicy) string {
	switch reason {
	case gpuv1alpha1.ReasonUpgradePaused:
		return fmt.Sprintf("fix the failed nodes (kubectl loom upgrades), then kubectl annotate clusterpolicy %s %s=true", cp.Name, gpuv1alpha1.AnnotationResume)
	case gpuv1alpha1.ReasonAutoUpgradeDisabled:
		return fmt.Sprintf("delete the driver pod of each node the message names when it may restart (kubectl delete pod -n <loom namespace> -l %s=%s --field-selector spec.nodeName=<node>), or let Loom roll it: kubectl patch clusterpolicy %s --type merge -p '{\"spec\":{\"driver\":{\"upgradePolicy\":{\"autoUpgrade\":true}}}}'",
			gpuv1alpha1.LabelComponent, gpuv1alpha1.OperandDriver, cp.Name)
	case gpuv1alpha1.ReasonUpgradeInvalid:
		return fmt.Sprintf("fix spec.driver.upgradePolicy (kubectl edit clusterpolicy %s)", cp.Name)
	case gpuv1alpha1.ReasonUpgradeInProgress:
		return "kubectl loom upgrades shows each node's progress"
	case ReasonIgnored:
		return fmt.Sprintf("only the oldest ClusterPolicy (%s) is in force: delete %s, or merge its settings into %s", cp.Status.ActivePolicy, cp.Name, cp.Status.ActivePolicy)
	case ReasonNoGPUNodes:
		return "check that the node agent runs on the GPU nodes (kubectl get gpunodes) or that node feature discovery labels them (feature.node.kubernetes.io/pci-10de.present)"
	case ReasonComponentsWait:
		return fmt.Sprintf("look at the operand pods that are not ready: kubectl get pods -A -l %s=%s", gpuv1alpha1.LabelPolicy, cp.Name)
	case ReasonApplyFailed:
		return "fix what the message names (an admission webhook, a quota, RBAC); Loom retries on its own; " + managerLogs
	case ReasonInvalidSpec:
		return fmt.Sprintf("fix the fields the message names (kubectl edit clusterpolicy %s)", cp.Name)
	}
	return ""
}

// rayAdvice is what to do about a RayCluster's reason.
func rayAdvice(reason string, rc *rayv1.RayCluster) string {
	switch reason {
	case ReasonNeverFits:
		return "reduce the GPUs per pod of the groups the message names, or add nodes that offer them (kubectl loom gpus)"
	case ReasonQueueNotFound:
		return fmt.Sprintf("create the Volcano queue %q (kubectl get queues.scheduling.volcano.sh), or set the cluster's %s label to one that exists", rayQueue(rc), RayLabelQueue)
	case ReasonQueueClosed:
		return fmt.Sprintf("open the Volcano queue %q again, or set the cluster's %s label to an open one", rayQueue(rc), RayLabelQueue)
	case ReasonVolcanoNotInstalled:
		return fmt.Sprintf("install Volcano, or label the cluster %s=none (kubectl label raycluster -n %s %s %s=none --overwrite)", RayLabelScheduler, rc.Namespace, rc.Name, RayLabelScheduler)
	case ReasonInvalidSpec:
		return fmt.Sprintf("fix the fields the message names (kubectl edit raycluster -n %s %s)", rc.Namespace, rc.Name)
	case ReasonTooManyPods:
		return "reduce the worker groups' replicas, or raise the manager's --max-workload-pods"
	case ReasonNameConflict:
		return "rename the cluster, or delete the object that holds the name (it is not the cluster's)"
	case ReasonFailedToApply:
		return "fix what the message names (a quota, an admission webhook); Loom retries on its own"
	case string(rayv1.RayClusterPodsProvisioning), string(rayv1.HeadPodNotFound), "HeadPodNotReady":
		return fmt.Sprintf("look at the pods' events: kubectl get pods -n %s -l ray.io/cluster=%s, then kubectl describe pod <pod>", rc.Namespace, rc.Name)
	case ReasonSuspended:
		return fmt.Sprintf("kubectl patch raycluster -n %s %s --type merge -p '{\"spec\":{\"suspend\":false}}' to resume", rc.Namespace, rc.Name)
	}
	return ""
}

// The reasons a RayJob's status.reason gives while its RayCluster cannot
// come up as it is (rayjob reconciler).
const (
	ReasonRayClusterNeverFits = "RayClusterNeverFits"
	ReasonRayClusterGangHeld  = "RayClusterGangHeld"
	ReasonRayClusterStalled   = "RayClusterStalled"
)

// rayJobAdvice is what to do about a RayJob's reason.
func rayJobAdvice(reason string, job *rayv1.RayJob) string {
	switch reason {
	case ReasonRayClusterNeverFits, ReasonRayClusterGangHeld, ReasonRayClusterStalled:
		return fmt.Sprintf("kubectl loom why raycluster/%s -n %s says why the cluster cannot come up", job.Status.RayClusterName, job.Namespace)
	case string(rayv1.DeadlineExceeded):
		return "raise spec.activeDeadlineSeconds, or make the job shorter"
	case string(rayv1.AppFailed):
		return fmt.Sprintf("read the Ray job's logs: kubectl logs -n %s job/%s (the submitter, in K8sJobMode), or the Ray dashboard of RayCluster %s", job.Namespace, job.Name, job.Status.RayClusterName)
	case string(rayv1.SubmissionFailed):
		return "the Ray job could not be submitted to its cluster's dashboard: check the head pod (kubectl loom why raycluster/" + job.Status.RayClusterName + " -n " + job.Namespace + ")"
	case string(rayv1.ValidationFailed):
		return fmt.Sprintf("fix the fields the message names (kubectl edit rayjob -n %s %s)", job.Namespace, job.Name)
	}
	if job.Status.JobDeploymentStatus == rayv1.JobDeploymentStatusSuspended {
		return fmt.Sprintf("kubectl patch rayjob -n %s %s --type merge -p '{\"spec\":{\"suspend\":false}}' to resume", job.Namespace, job.Name)
	}
	return ""
}

// KubeRay's gang-scheduling labels on a RayCluster.
const (
	RayLabelScheduler = "ray.io/scheduler-name"
	RayLabelQueue     = "volcano.sh/queue-name"
)

// rayQueue is the Volcano queue a RayCluster names (Volcano's default when
// none).
func rayQueue(rc *rayv1.RayCluster) string {
	if q := rc.Labels[RayLabelQueue]; q != "" {
		return q
	}
	return "default"
}
