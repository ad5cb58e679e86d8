package rayjob

import (
	"fmt"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons a RayJob gives, while it has not submitted yet, when its
// RayCluster's own conditions (written by Loom's raycluster controller)
// say the cluster cannot come up as it is. The RayJob stays Initializing:
// each can change without a new RayJob (nodes join, a queue is created,
// Volcano is installed), and the reason goes when the cluster's verdict
// does.
const (
	// ReasonClusterNeverFits: the cluster's loom.dev/GPUInventory is
	// False: a group's pod is bigger than every node it may go to.
	ReasonClusterNeverFits rayv1.JobFailedReason = "RayClusterNeverFits"
	// ReasonClusterGangHeld: the cluster's loom.dev/GangScheduling is
	// False and holds its pods: Volcano keeps its PodGroup unschedulable,
	// its queue is missing or closed, or Volcano is not installed under
	// --gang-scheduler=volcano.
	ReasonClusterGangHeld rayv1.JobFailedReason = "RayClusterGangHeld"
	// ReasonClusterStalled: the cluster is Stalled for another reason
	// only a person can lift (a spec Loom refuses, too many pods, a name
	// taken).
	ReasonClusterStalled rayv1.JobFailedReason = "RayClusterStalled"
)

// The RayCluster conditions Loom's raycluster controller writes, as the
// README documents them: the two controllers agree through the API and
// never import each other.
const (
	// clusterConditionGPUs is False (NeverFits) while a group's pod is
	// bigger than every node it may go to.
	clusterConditionGPUs = "loom.dev/GPUInventory"
	// clusterConditionGang is False while Volcano holds the cluster's
	// PodGroup or its queue keeps Volcano from admitting it.
	clusterConditionGang = "loom.dev/GangScheduling"
	// clusterConditionStalled is kstatus's: True while only a person can
	// move the cluster on.
	clusterConditionStalled = "Stalled"
	// reasonVolcanoNotInstalled is the gang reason for a missing Volcano:
	// it holds the cluster only when the cluster is also Stalled; under the
	// manager's --gang-scheduler=auto the cluster runs without a gang and
	// only says so.
	reasonVolcanoNotInstalled = "VolcanoNotInstalled"
)

func isVerdict(r rayv1.JobFailedReason) bool {
	return r == ReasonClusterNeverFits || r == ReasonClusterGangHeld || r == ReasonClusterStalled
}

// clusterVerdict is what the cluster's conditions say stands between it
// and running, as a reason and a message naming the cluster; "" when
// nothing does (or the cluster is run by a controller that writes none of
// Loom's conditions). The inventory's verdict comes first: no queue or
// gang can make a pod fit that no node can hold.
func clusterVerdict(rc *rayv1.RayCluster) (rayv1.JobFailedReason, string) {
	conds := rc.Status.Conditions
	if c := meta.FindStatusCondition(conds, clusterConditionGPUs); c != nil && c.Status == metav1.ConditionFalse {
		return ReasonClusterNeverFits, fmt.Sprintf("RayCluster %s can never fit: %s", rc.Name, c.Message)
	}
	stalled := meta.FindStatusCondition(conds, clusterConditionStalled)
	isStalled := stalled != nil && stalled.Status == metav1.ConditionTrue
	if c := meta.FindStatusCondition(conds, clusterConditionGang); c != nil && c.Status == metav1.ConditionFalse &&
		(c.Reason != reasonVolcanoNotInstalled || isStalled) {
		return ReasonClusterGangHeld, fmt.Sprintf("RayCluster %s's gang is held (%s): %s", rc.Name, c.Reason, c.Message)
	}
	if isStalled {
		return ReasonClusterStalled, fmt.Sprintf("RayCluster %s is stalled (%s): %s", rc.Name, stalled.Reason, stalled.Message)
	}
	return "", ""
}

// clusterConditionReady is kstatus's Ready, which Loom's raycluster
// controller writes with the reason and message of what holds the
// cluster.
const clusterConditionReady = "Ready"

// clusterProblem is why a cluster that is not ready is not, as its
// conditions say, with the condition's reason (" (reason): message"; ""
// when they say nothing). Loom's raycluster says it in Ready: the pods on
// their way, a head pod not ready, a pod create the API server refused.
// Its ReplicaFailure also tells of an optional child (the serve Service,
// the dashboard Ingress) left out for a name taken, which holds neither
// the cluster nor the job, and is not the job's to say. A cluster another
// operator runs (KubeRay) says it in ReplicaFailure (a pod create
// refused), HeadPodReady or RayClusterProvisioned.
func clusterProblem(rc *rayv1.RayCluster) string {
	conds := rc.Status.Conditions
	say := func(c *metav1.Condition, name string) string {
		return fmt.Sprintf(" (%s%s): %s", name, c.Reason, c.Message)
	}
	if c := meta.FindStatusCondition(conds, clusterConditionReady); c != nil {
		if c.Status == metav1.ConditionFalse && c.Message != "" {
			return say(c, "")
		}
		return ""
	}
	if c := meta.FindStatusCondition(conds, string(rayv1.RayClusterReplicaFailure)); c != nil && c.Status == metav1.ConditionTrue && c.Message != "" {
		return say(c, c.Type+", ")
	}
	for _, t := range []rayv1.RayClusterConditionType{rayv1.HeadPodReady, rayv1.RayClusterProvisioned} {
		if c := meta.FindStatusCondition(conds, string(t)); c != nil && c.Status == metav1.ConditionFalse && c.Message != "" {
			return say(c, c.Type+", ")
		}
	}
	if rc.Status.State != "" {
		return fmt.Sprintf(" (state %q)", rc.Status.State)
	}
	return ""
}
