package why

import (
	"fmt"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

// UpgradeNode is one node of `kubectl loom upgrades`.
type UpgradeNode struct {
	Name string `json:"name"`
	// State is the nvidia.com/gpu-driver-upgrade-state label ("" before
	// any upgrade).
	State string `json:"state,omitempty"`
	// Claim is the ClusterPolicy whose upgrade enrolled the node; a state
	// without a claim is not Loom's and is left alone.
	Claim    string `json:"claim,omitempty"`
	Cordoned bool   `json:"cordoned"`
	// WasCordoned: someone else cordoned the node before its upgrade; it
	// stays cordoned afterwards.
	WasCordoned bool `json:"wasCordoned,omitempty"`
	// Since is how long the node has been in its state.
	Since string `json:"since,omitempty"`
	// Started is how long ago its upgrade began.
	Started string `json:"started,omitempty"`
	// Target is the driver pod template hash the upgrade is for.
	Target string `json:"target,omitempty"`
	// Detail is the failure, the refused eviction, or why Loom ignores it.
	Detail string `json:"detail,omitempty"`
}

// PolicyUpgrade is a ClusterPolicy's DriverUpgrade condition.
type PolicyUpgrade struct {
	Policy  string `json:"policy"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Upgrades is the DriverUpgrade condition of each policy in force.
func Upgrades(policies []gpuv1alpha1.ClusterPolicy) []PolicyUpgrade {
	var out []PolicyUpgrade
	for i := range policies {
		cp := &policies[i]
		if cp.Status.State == gpuv1alpha1.PolicyIgnored {
			continue
		}
		u := PolicyUpgrade{Policy: cp.Name, Status: "Unknown", Message: "no DriverUpgrade condition yet"}
		if c := cond(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade); c != nil {
			u.Status, u.Reason, u.Message = string(c.Status), c.Reason, OneLine(c.Message)
		}
		out = append(out, u)
	}
	return out
}

// UpgradeNodes is one row per GPU node or node with an upgrade state, the
// nodes furthest from done first (failed, then by state order), then by
// name.
func UpgradeNodes(nodes []corev1.Node, now time.Time, names sharing.Names) []UpgradeNode {
	var out []UpgradeNode
	for i := range nodes {
		n := &nodes[i]
		state := n.Labels[gpuv1alpha1.LabelUpgradeState]
		if state == "" && !IsGPUNode(n, false, names) {
			continue
		}
		out = append(out, upgradeNode(n, now))
	}
	rank := func(s string) int {
		switch {
		case s == gpuv1alpha1.UpgradeFailed:
			return 0
		case s == "":
			return len(gpuv1alpha1.UpgradeStates) + 1
		case !gpuv1alpha1.KnownUpgradeState(s):
			return 1
		}
		return 1 + slices.Index(gpuv1alpha1.UpgradeStates, s)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if ri, rj := rank(out[i].State), rank(out[j].State); ri != rj {
			return ri < rj
		}
		return out[i].Name < out[j].Name
	})
	return out
}

func upgradeNode(n *corev1.Node, now time.Time) UpgradeNode {
	an := n.Annotations
	u := UpgradeNode{Name: n.Name, State: n.Labels[gpuv1alpha1.LabelUpgradeState], Claim: an[gpuv1alpha1.AnnotationClaim],
		Cordoned: n.Spec.Unschedulable, WasCordoned: an[gpuv1alpha1.AnnotationWasCordoned] != "",
		Target: an[gpuv1alpha1.AnnotationTarget]}
	u.Since = sinceAnnotation(an[gpuv1alpha1.AnnotationPhaseStarted], now)
	u.Started = sinceAnnotation(an[gpuv1alpha1.AnnotationUpgradeStarted], now)
	switch {
	case u.State != "" && u.Claim == "":
		u.Detail = "not claimed by Loom (no " + gpuv1alpha1.AnnotationClaim + "): ignored"
	case !gpuv1alpha1.KnownUpgradeState(u.State):
		u.Detail = fmt.Sprintf("unknown state %q: Loom leaves the node alone until the label is removed", u.State)
	case an[gpuv1alpha1.AnnotationFailure] != "":
		u.Detail = OneLine(an[gpuv1alpha1.AnnotationFailure])
		if an[gpuv1alpha1.AnnotationFailureAcknowledged] != "" {
			u.Detail += " (acknowledged by a resume)"
		}
	case an[gpuv1alpha1.AnnotationBlocked] != "":
		u.Detail = "blocked: " + OneLine(an[gpuv1alpha1.AnnotationBlocked])
	}
	return u
}

// sinceAnnotation is the age of an RFC 3339 time annotation ("" when unset,
// the raw value when it does not parse).
func sinceAnnotation(v string, now time.Time) string {
	if v == "" {
		return ""
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return v
	}
	return Age(t, now)
}
