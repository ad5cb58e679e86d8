package v1alpha1

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FieldOwnerDriverUpgrade names the driver upgrade's writes: its node
// patches (so a node's managed fields say whether Loom's cordon is still
// the node's), its driver pod deletes and its condition on the
// ClusterPolicy.
const FieldOwnerDriverUpgrade = "loom-driver-upgrade"

// FieldOwnerClusterPolicy is the ClusterPolicy controller's field manager:
// its writes (the operands, and on GPU nodes the
// nvidia.com/gpu.deploy.<operand>=true labels it sets where missing) carry
// it, so a node's managed fields say which of those labels are Loom's.
const FieldOwnerClusterPolicy = "loom-clusterpolicy"

// DeployLabelPrefix starts GPU Operator's per-operand switches on a node,
// nvidia.com/gpu.deploy.<operand>.
const DeployLabelPrefix = LabelPrefix + "gpu.deploy."

// LoomCordoned reports whether the node's cordon is Loom's to lift: the
// node carries claim, its upgrade started without someone else's cordon
// (AnnotationWasCordoned, of any value), it is unschedulable, and Loom's
// field owner still manages spec.unschedulable. Anyone who writes the
// field after Loom (kubectl uncordon then cordon, another tool) takes it
// over, and their cordon is left in place; a kubectl cordon of a node
// already cordoned changes nothing on the server and cannot be told apart
// (annotate the node AnnotationWasCordoned to keep it cordoned). A node
// without managed fields (stripped by a client) gives no evidence either
// way, and the annotations decide.
func LoomCordoned(n *corev1.Node, claim string) bool {
	_, started := n.Annotations[AnnotationUpgradeStarted]
	_, was := n.Annotations[AnnotationWasCordoned]
	return claim != "" && n.Annotations[AnnotationClaim] == claim && started && !was &&
		n.Spec.Unschedulable && (len(n.ManagedFields) == 0 || ManagesUnschedulable(n.ManagedFields, FieldOwnerDriverUpgrade))
}

// ManagesUnschedulable reports whether manager owns the node's
// spec.unschedulable in its managed fields.
func ManagesUnschedulable(fields []metav1.ManagedFieldsEntry, manager string) bool {
	for _, f := range fields {
		if f.Manager != manager || f.FieldsV1 == nil {
			continue
		}
		var set struct {
			Spec map[string]json.RawMessage `json:"f:spec"`
		}
		if json.Unmarshal(f.FieldsV1.GetRawBytes(), &set) == nil {
			if _, ok := set.Spec["f:unschedulable"]; ok {
				return true
			}
		}
	}
	return false
}

// ManagesLabel reports whether manager owns the label key in fields, a
// node's managed fields.
func ManagesLabel(fields []metav1.ManagedFieldsEntry, manager, key string) bool {
	for _, f := range fields {
		if f.Manager != manager || f.FieldsV1 == nil {
			continue
		}
		var set struct {
			Metadata struct {
				Labels map[string]json.RawMessage `json:"f:labels"`
			} `json:"f:metadata"`
		}
		if json.Unmarshal(f.FieldsV1.GetRawBytes(), &set) == nil {
			if _, ok := set.Metadata.Labels["f:"+key]; ok {
				return true
			}
		}
	}
	return false
}
