// Package kueue is Loom's adapter to Kueue's Workload API (kueue.x-k8s.io
// v1beta2, the storage version Kueue v0.17 serves): TrainingJobs are a Kueue
// "external framework", so Loom implements the part of Kueue's jobframework
// contract that a job controller owns. A job carrying the
// kueue.x-k8s.io/queue-name label gets one Workload (its pod sets, owner
// reference and name as jobframework builds them); the job runs only while
// that Workload is admitted, with the admitted flavours' node labels and
// tolerations on its pods; an evicted Workload's gang is stopped and its
// quota reservation released; a Workload of a job that ended is marked
// Finished.
//
// The Workload is handled as an unstructured object with the few typed
// fields below rather than through Kueue's Go API types: requiring
// sigs.k8s.io/kueue (even its API package alone) raises
// github.com/ray-project/kuberay/ray-operator from v1.5.0 to v1.6.0, whose
// builders controllers/raycluster calls with other signatures, and Kueue's
// jobframework library does not compile against Loom's k8s.io/api. The JSON
// field names here are Kueue v1beta2's.
package kueue

import (
	"crypto/sha1" //nolint:gosec // jobframework's workload names are a SHA-1 prefix; not a security use.
	"encoding/hex"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// Labels Kueue reads on jobs and writes on Workloads.
const (
	// QueueLabel names the LocalQueue of a job; a job without it is not
	// Kueue's.
	QueueLabel = "kueue.x-k8s.io/queue-name"
	// PriorityClassLabel names a WorkloadPriorityClass.
	PriorityClassLabel = "kueue.x-k8s.io/priority-class"
	// JobUIDLabel on a Workload is its job's UID.
	JobUIDLabel = "kueue.x-k8s.io/job-uid"
	// MaxExecTimeLabel on a job bounds, in seconds, how long its Workload
	// may stay admitted (spec.maximumExecutionTimeSeconds).
	MaxExecTimeLabel = "kueue.x-k8s.io/max-exec-time-seconds"
	// PodSetLabel on an admitted job's pod names its pod set.
	PodSetLabel = "kueue.x-k8s.io/podset"
	// ProvReqAnnotationPrefix starts the job annotations that parameterise
	// a ProvisioningRequest admission check; they are copied to the
	// Workload.
	ProvReqAnnotationPrefix = "provreq.kueue.x-k8s.io/"
)

// ResourceInUseFinalizer is the finalizer a job controller puts on the
// Workloads it creates (jobframework's NewWorkload) and removes once the
// job's pods are stopped: a Workload deleted by a person, or by Kueue,
// keeps its quota until the gang is gone.
const ResourceInUseFinalizer = "kueue.x-k8s.io/resource-in-use"

// Workload condition types (Kueue's).
const (
	CondQuotaReserved = "QuotaReserved"
	CondAdmitted      = "Admitted"
	CondEvicted       = "Evicted"
	CondFinished      = "Finished"
	CondPodsReady     = "PodsReady"
)

// Group is Kueue's API group.
const Group = "kueue.x-k8s.io"

var (
	// WorkloadGVK is the Workload kind at its storage version.
	WorkloadGVK = schema.GroupVersionKind{Group: Group, Version: "v1beta2", Kind: "Workload"}
	// ResourceFlavorGVK is the ResourceFlavor kind.
	ResourceFlavorGVK = schema.GroupVersionKind{Group: Group, Version: "v1beta2", Kind: "ResourceFlavor"}
	// WorkloadPriorityClassGVK is the WorkloadPriorityClass kind.
	WorkloadPriorityClassGVK = schema.GroupVersionKind{Group: Group, Version: "v1beta2", Kind: "WorkloadPriorityClass"}
	// LocalQueueGVK is the LocalQueue kind.
	LocalQueueGVK = schema.GroupVersionKind{Group: Group, Version: "v1beta2", Kind: "LocalQueue"}
)

// DefaultLocalQueue is the name of a namespace's default LocalQueue: a job
// created without a queue label in a namespace that has one is labelled
// with it (Kueue's LocalQueueDefaulting, locked on since v0.17).
const DefaultLocalQueue = "default"

// Names of Kueue's CRDs Loom watches for.
const (
	WorkloadCRD              = "workloads.kueue.x-k8s.io"
	WorkloadPriorityClassCRD = "workloadpriorityclasses.kueue.x-k8s.io"
	LocalQueueCRD            = "localqueues.kueue.x-k8s.io"
)

// Workload is the part of a Kueue Workload Loom reads and writes.
type Workload struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              WorkloadSpec   `json:"spec"`
	Status            WorkloadStatus `json:"status,omitempty"`
}

// WorkloadSpec is the Workload's spec.
type WorkloadSpec struct {
	PodSets          []PodSet          `json:"podSets"`
	QueueName        string            `json:"queueName,omitempty"`
	PriorityClassRef *PriorityClassRef `json:"priorityClassRef,omitempty"`
	Priority         *int32            `json:"priority,omitempty"`
	// MaximumExecutionTimeSeconds: Kueue deactivates (evicts, without
	// requeueing) the Workload once it has been admitted that long.
	MaximumExecutionTimeSeconds *int32 `json:"maximumExecutionTimeSeconds,omitempty"`
	// Active false deactivates the Workload: Kueue evicts it (reason
	// Deactivated, or DeactivatedDueTo<cause> when Kueue deactivated it
	// itself) and does not queue it until it is set true again. Unset is
	// true.
	Active *bool `json:"active,omitempty"`
}

// PriorityClassRef names the Workload's priority class.
type PriorityClassRef struct {
	Group string `json:"group,omitempty"`
	Kind  string `json:"kind,omitempty"`
	Name  string `json:"name,omitempty"`
}

// PodSet is one group of identical pods.
type PodSet struct {
	Name     string                 `json:"name"`
	Template corev1.PodTemplateSpec `json:"template"`
	Count    int32                  `json:"count"`
}

// WorkloadStatus is the Workload's status.
type WorkloadStatus struct {
	Conditions      []metav1.Condition    `json:"conditions,omitempty"`
	Admission       *Admission            `json:"admission,omitempty"`
	AdmissionChecks []AdmissionCheckState `json:"admissionChecks,omitempty"`
	// RequeueState is Kueue's backoff after an eviction for
	// PodsReadyTimeout (or a retried admission check).
	RequeueState *RequeueState `json:"requeueState,omitempty"`
}

// RequeueState says when Kueue queues an evicted Workload again, and how
// many times it has.
type RequeueState struct {
	Count     *int32       `json:"count,omitempty"`
	RequeueAt *metav1.Time `json:"requeueAt,omitempty"`
}

// AdmissionCheckState is one admission check's word on the Workload.
type AdmissionCheckState struct {
	Name    string `json:"name,omitempty"`
	State   string `json:"state,omitempty"`
	Message string `json:"message,omitempty"`
	// PodSetUpdates are what the check asks of each pod set's pods once
	// the Workload is admitted (a ProvisioningRequest check: the
	// annotations that let the pods consume the capacity it booked).
	PodSetUpdates []PodSetUpdate `json:"podSetUpdates,omitempty"`
}

// PodSetUpdate is what an admission check adds to one pod set's pods.
type PodSetUpdate struct {
	Name         string              `json:"name"`
	Labels       map[string]string   `json:"labels,omitempty"`
	Annotations  map[string]string   `json:"annotations,omitempty"`
	NodeSelector map[string]string   `json:"nodeSelector,omitempty"`
	Tolerations  []corev1.Toleration `json:"tolerations,omitempty"`
}

// Admission is where Kueue admitted the Workload.
type Admission struct {
	ClusterQueue      string             `json:"clusterQueue"`
	PodSetAssignments []PodSetAssignment `json:"podSetAssignments"`
}

// PodSetAssignment is one pod set's flavours and usage.
type PodSetAssignment struct {
	Name          string                         `json:"name"`
	Flavors       map[corev1.ResourceName]string `json:"flavors,omitempty"`
	ResourceUsage corev1.ResourceList            `json:"resourceUsage,omitempty"`
	Count         *int32                         `json:"count,omitempty"`
}

// ResourceFlavor is the part of a ResourceFlavor that reaches pods.
type ResourceFlavor struct {
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		NodeLabels  map[string]string   `json:"nodeLabels,omitempty"`
		Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	} `json:"spec"`
}

// WorkloadName is the Workload name Kueue's jobframework gives the Workload
// of a job (GetWorkloadNameForOwnerWithGVK): "<kind>-<name>" truncated to 247
// characters, "-", and five hex digits of a SHA-1 of the kind, group, name
// and UID.
func WorkloadName(name string, uid types.UID, gvk schema.GroupVersionKind) string {
	const hashLength, maxName = 5, 253
	prefix := strings.ToLower(gvk.Kind) + "-" + name
	if n := maxName - 1 - hashLength; len(prefix) > n {
		prefix = prefix[:n]
	}
	h := sha1.New() //nolint:gosec // see the import
	h.Write([]byte(gvk.Kind + "\n" + gvk.Group + "\n" + name + "\n" + string(uid)))
	return prefix + "-" + hex.EncodeToString(h.Sum(nil))[:hashLength]
}

// MaxExecTime is the job's MaxExecTimeLabel as jobframework reads it
// (MaximumExecutionTimeSeconds): a positive 32-bit number, else nil.
func MaxExecTime(labels map[string]string) *int32 {
	v, err := strconv.ParseInt(labels[MaxExecTimeLabel], 10, 32)
	if err != nil || v <= 0 {
		return nil
	}
	n := int32(v)
	return &n
}

// ProvReqAnnotations are the job's annotations that jobframework copies to
// the Workload (FilterProvReqAnnotations): those with the
// ProvReqAnnotationPrefix, which a ProvisioningRequest check reads there.
func ProvReqAnnotations(annotations map[string]string) map[string]string {
	var out map[string]string
	for k, v := range annotations {
		if strings.HasPrefix(k, ProvReqAnnotationPrefix) {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}
