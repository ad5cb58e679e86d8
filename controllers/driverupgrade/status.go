package driverupgrade

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
)

// maxNamed caps each list of nodes a message names.
const maxNamed = 10

// summary is the rollout as one pass saw it, for the ClusterPolicy's
// DriverUpgrade condition.
type summary struct {
	nodes, upToDate, inProgress, waiting int
	// placing counts idle nodes with no driver pod yet: the DaemonSet is
	// placing it (a first install, a new GPU node), no upgrade is needed.
	placing int
	// unplaced are the GPU nodes no driver DaemonSet of the policy
	// selects (an opt-out label, a host driver, a node selector, a taint,
	// an OS without a driver) that do not run the wanted driver, those
	// leaving their upgrade included: not counted among the nodes.
	unplaced []string
	// manual are the idle nodes on an older driver that autoUpgrade: false
	// leaves until a person deletes their driver pod.
	manual []string
	// notReady are the upgrading nodes whose Ready condition is not True:
	// they wait for their kubelet, and no phase timeout fails them.
	notReady []string
	// lost are the failed nodes that were NotReady longer than
	// notReadyTimeout: each retries once Ready.
	lost                     []string
	paused                   bool
	failed, blocked, ignored []string
	// firstFailure is the first failed node and why it failed.
	firstFailure string
}

// add counts one node of the set.
func (s *summary) add(v nodeView, k kind, why string) {
	if v.unplaced && k != ignored && (k != idle || !runsTemplate(v)) {
		s.unplaced = append(s.unplaced, v.node.Name)
		return
	}
	s.nodes++
	switch k {
	case ignored:
		s.ignored = append(s.ignored, why)
	case upgrading:
		s.inProgress++
		if !inventory.NodeReady(v.node) {
			s.notReady = append(s.notReady, v.node.Name)
		}
	case failed:
		s.failed = append(s.failed, v.node.Name)
		if v.node.Annotations[gpuv1alpha1.AnnotationFailedNotReady] != "" {
			s.lost = append(s.lost, v.node.Name)
		}
		if why := v.node.Annotations[gpuv1alpha1.AnnotationFailure]; why != "" && s.firstFailure == "" {
			s.firstFailure = v.node.Name + ": " + why
		}
	case idle:
		switch {
		case runsTemplate(v):
			s.upToDate++
		case v.driver == nil:
			s.placing++
		}
	}
	if b := v.node.Annotations[gpuv1alpha1.AnnotationBlocked]; b != "" && k != ignored {
		s.blocked = append(s.blocked, v.node.Name+" ("+b+")")
	}
}

// runsTemplate reports whether the node's driver pod is of its DaemonSet's
// template.
func runsTemplate(v nodeView) bool {
	return v.driver != nil && v.target != "" && v.driver.Annotations[gpuv1alpha1.AnnotationTemplateHash] == v.target
}

// awaitsDriverPods reports whether the rollout's count changes as the
// driver DaemonSets place pods: nodes wait for their first driver pod, or
// for the one that replaces a driver pod a person deleted (autoUpgrade
// off, or on a failed node, which finishes once it runs the wanted driver).
// Only then is a DaemonSet placing pods worth a pass.
func (s summary) awaitsDriverPods() bool {
	return s.placing > 0 || len(s.manual) > 0 || len(s.failed) > 0
}

// names lists at most maxNamed of names, saying how many more there are.
func names(list []string) string {
	if len(list) <= maxNamed {
		return strings.Join(list, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(list[:maxNamed], ", "), len(list)-maxNamed)
}

// condition is the DriverUpgrade condition for a pass's summary: the
// reason, status and a message that says "k of n nodes upgraded" and
// names the failed, blocked and ignored nodes.
func condition(s summary, invalid error) (metav1.ConditionStatus, string, string) {
	parts := []string{fmt.Sprintf("%d of %d GPU nodes run the wanted driver", s.upToDate, s.nodes)}
	if s.inProgress > 0 {
		parts = append(parts, fmt.Sprintf("%d upgrading", s.inProgress))
	}
	if len(s.notReady) > 0 {
		parts = append(parts, fmt.Sprintf("%d upgrading nodes are NotReady and wait for their kubelet (no phase timeout fails them; "+
			"it counts again from when they are Ready; NotReady for more than %s, a node fails and frees its slot): %s",
			len(s.notReady), notReadyTimeout, names(s.notReady)))
	}
	if s.waiting > 0 {
		parts = append(parts, fmt.Sprintf("%d waiting", s.waiting))
	}
	if s.placing > 0 {
		parts = append(parts, fmt.Sprintf("%d waiting for the DaemonSet to place their driver pod (no upgrade needed)", s.placing))
	}
	if len(s.unplaced) > 0 {
		parts = append(parts, fmt.Sprintf("%d GPU nodes run no driver of this policy (no driver DaemonSet selects them: "+
			"nvidia.com/gpu.deploy.driver=false or =pre-installed, a node selector, a taint, or an OS without a driver): %s", len(s.unplaced), names(s.unplaced)))
	}
	if len(s.failed) > 0 {
		parts = append(parts, fmt.Sprintf("failed (%d): %s (see annotation %s)", len(s.failed), names(s.failed), gpuv1alpha1.AnnotationFailure))
		if len(s.lost) > 0 {
			parts = append(parts, fmt.Sprintf("%d failed nodes were NotReady for more than %s (their slots are free; each retries once Ready): %s",
				len(s.lost), notReadyTimeout, names(s.lost)))
		}
		if s.firstFailure != "" {
			parts = append(parts, s.firstFailure)
		}
	}
	if len(s.blocked) > 0 {
		parts = append(parts, fmt.Sprintf("blocked (%d): %s", len(s.blocked), names(s.blocked)))
	}
	if len(s.ignored) > 0 {
		parts = append(parts, fmt.Sprintf("ignored: %d nodes carry %s without Loom's claim (%s) or with a value Loom does not know: %s",
			len(s.ignored), gpuv1alpha1.LabelUpgradeState, gpuv1alpha1.AnnotationClaim, names(s.ignored)))
	}
	msg := strings.Join(parts, "; ")
	if len(s.manual) > 0 {
		msg = fmt.Sprintf("autoUpgrade is false: %d GPU nodes run an older driver until their driver pod is deleted (or autoUpgrade is set): %s; %s",
			len(s.manual), names(s.manual), msg)
	}
	switch {
	case invalid != nil:
		return metav1.ConditionFalse, gpuv1alpha1.ReasonUpgradeInvalid, invalid.Error() + "; " + msg
	case s.paused:
		return metav1.ConditionFalse, gpuv1alpha1.ReasonUpgradePaused, fmt.Sprintf(
			"paused: maxFailures reached, no node starts until a new driver version or the annotation %s on the ClusterPolicy; %s",
			gpuv1alpha1.AnnotationResume, msg)
	case s.inProgress > 0 || s.waiting > 0 || len(s.failed) > 0:
		return metav1.ConditionFalse, gpuv1alpha1.ReasonUpgradeInProgress, msg
	case len(s.manual) > 0:
		// Not UpToDate: the policy's driver version does not run there, and
		// nothing will change until a person acts.
		return metav1.ConditionFalse, gpuv1alpha1.ReasonAutoUpgradeDisabled, msg
	}
	return metav1.ConditionTrue, gpuv1alpha1.ReasonUpgradeUpToDate, msg
}

// upgradeStatus is the part of a ClusterPolicy's status this controller
// writes: its one condition.
type upgradeStatus struct {
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// currentStatus is the DriverUpgrade condition the policy carries.
func currentStatus(cp *gpuv1alpha1.ClusterPolicy) *upgradeStatus {
	st := &upgradeStatus{}
	for _, c := range cp.Status.Conditions {
		if c.Type == gpuv1alpha1.ConditionDriverUpgrade {
			st.Conditions = append(st.Conditions, c)
		}
	}
	return st
}

// desiredStatus is the policy's DriverUpgrade condition after a pass.
func desiredStatus(cp *gpuv1alpha1.ClusterPolicy, status metav1.ConditionStatus, reason, msg string, now time.Time) *upgradeStatus {
	st := currentStatus(cp)
	apply.SetCondition(&st.Conditions, gpuv1alpha1.ConditionDriverUpgrade, status, reason, msg, cp.Generation, now)
	return st
}
