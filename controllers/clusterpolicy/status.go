package clusterpolicy

import (
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/driveros"
)

// Reasons of the ClusterPolicy Ready condition.
const (
	ReasonAllReady       = "AllComponentsReady"
	ReasonComponentsWait = "ComponentsNotReady"
	ReasonNoGPUNodes     = "NoGPUNodes"
	ReasonIgnored        = "AnotherPolicyActive"
	ReasonApplyFailed    = "ApplyFailed"
	// ReasonInvalidSpec: the spec holds a value the API server's rules let
	// through (a label key too long for CEL to check, an object stored
	// before a rule existed, a value it refuses in the operands' pods);
	// the message names each field. Nothing is written and no driver
	// upgrade starts while it stands.
	ReasonInvalidSpec = "InvalidSpec"
)

const (
	conditionReady = "Ready"
	// conditionReconciling and conditionStalled are kstatus's (Helm's
	// --wait, Flux, cli-utils): Reconciling is True while the stack rolls
	// out, Stalled while only a person can move it on (an invalid spec,
	// another policy in force), which kstatus reads as Failed.
	conditionReconciling  = "Reconciling"
	conditionStalled      = "Stalled"
	componentStateReady   = "ready"
	componentStateWaiting = "notReady"
	componentStateOff     = "disabled"
	// maxListed caps the node names a status list holds.
	maxListed = 20
	// maxSpecErrors caps the field errors the InvalidSpec message lists.
	maxSpecErrors = 5
)

// observed is what one pass saw in the cache.
type observed struct {
	// active names the ClusterPolicy in force ("" when none is).
	active string
	// gpuNodes counts the nodes labelled nvidia.com/gpu.present=true.
	gpuNodes int32
	upgrades upgradeCounts
	// inventory is every GPUNode (the MIG summary).
	inventory []gpuv1alpha1.GPUNode
	// daemonSets are the enabled operands' DaemonSets by operand name (the
	// driver's summed); a missing one is not created yet.
	daemonSets map[string]*appsv1.DaemonSet
	// migStates counts the GPU nodes by MIG manager state.
	migStates migStates
	// cluster is what desired reads beside the policy.
	cluster cluster
	// driverSets names the driver DaemonSets there are.
	driverSets []string
	// held and noDriver are desired's: operands not rolled out and why,
	// GPU nodes without a driver and why.
	held     map[string]string
	noDriver []string
	// untolerated names, by operand, the GPU nodes meant for it that a
	// taint keeps its pods off (untoleratedTaints).
	untolerated map[string][]string
	// refused is what the API server refuses in the operands' pods
	// (refused): the spec is invalid.
	refused []string
}

// upgradeCounts are the GPU nodes by driver upgrade progress.
type upgradeCounts struct {
	inProgress, failed []string
	// firstFailure is why the first failed node (by name) failed.
	firstFailure string
}

// ignoredStatus is the status of a policy that is not in force: it names
// the one that is and reports no components.
func ignoredStatus(cp *gpuv1alpha1.ClusterPolicy, active string) *gpuv1alpha1.ClusterPolicyStatus {
	st := cp.Status.DeepCopy()
	st.ObservedGeneration = cp.Generation
	st.State, st.ActivePolicy, st.Components = gpuv1alpha1.PolicyIgnored, active, nil
	setReady(st, cp.Generation, metav1.ConditionFalse, ReasonIgnored,
		fmt.Sprintf("ClusterPolicy %s is in force (the oldest); this one is ignored", active))
	settle(st, cp.Generation)
	return st
}

// status is the status of the policy in force, a pure function of the
// policy, what the pass observed and the writes that failed.
func status(cp *gpuv1alpha1.ClusterPolicy, obs observed, writeErrs []string) *gpuv1alpha1.ClusterPolicyStatus {
	st := cp.Status.DeepCopy()
	st.ObservedGeneration = cp.Generation
	st.ActivePolicy = ""
	st.GPUNodes = obs.gpuNodes
	on, off := enabledOperands(cp)
	st.Components = components(cp, on, off, obs)
	st.MIG = summarizeMIG(obs.inventory, obs.migStates)
	st.MIG.Strategy = cp.Spec.MIG.Strategy
	if st.MIG.Strategy == "" {
		st.MIG.Strategy = gpuv1alpha1.MIGStrategySingle
	}
	readiness(st, obs.gpuNodes, append(specErrors(cp), obs.refused...), writeErrs, cp.Generation)
	if u := meta.FindStatusCondition(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade); u != nil && readyReason(st) == ReasonComponentsWait {
		// A driver upgrade that waits for a person names itself in Ready.
		switch u.Reason {
		case gpuv1alpha1.ReasonUpgradePaused:
			setReady(st, cp.Generation, metav1.ConditionFalse, gpuv1alpha1.ReasonUpgradePaused, "driver upgrade paused: "+u.Message)
		case gpuv1alpha1.ReasonAutoUpgradeDisabled:
			setReady(st, cp.Generation, metav1.ConditionFalse, gpuv1alpha1.ReasonAutoUpgradeDisabled, "driver not upgraded: "+u.Message)
		}
	}
	settle(st, cp.Generation)
	return st
}

// specErrors are the spec's field errors (Validate, pure), at most
// maxSpecErrors of them and a count of the rest.
func specErrors(cp *gpuv1alpha1.ClusterPolicy) []string {
	errs := cp.Spec.Validate()
	var out []string
	for i, e := range errs {
		if i == maxSpecErrors {
			out = append(out, fmt.Sprintf("and %d more", len(errs)-maxSpecErrors))
			break
		}
		out = append(out, e.Error())
	}
	return out
}

// components reports each operand's rollout from its DaemonSet.
func components(cp *gpuv1alpha1.ClusterPolicy, on, off []operand, obs observed) []gpuv1alpha1.ComponentStatus {
	var out []gpuv1alpha1.ComponentStatus
	for _, op := range on {
		_, ref := cp.Spec.Operand(op.name).EffectiveImage(defaultsFor(op.name))
		c := gpuv1alpha1.ComponentStatus{Name: op.name, Enabled: true, State: componentStateWaiting, Version: ref[strings.LastIndex(ref, ":")+1:]}
		ds := obs.daemonSets[op.name]
		meant := meantNodes(cp, op.name, obs.cluster.nodes)
		switch {
		case obs.held[op.name] != "":
			c.Message = obs.held[op.name]
			out = append(out, c)
			continue
		case len(obs.cluster.nodes) > 0 && len(meant) == 0 && (ds == nil || ds.Status.DesiredNumberScheduled == 0):
			// Every GPU node opted out of the operand (a driver installed
			// on the host, say) or is outside its node selector: there is
			// nothing to roll out, which is done, not waiting.
			c.State = componentStateReady
			c.Message = fmt.Sprintf("meant for none of the %d GPU nodes (each has %s or %soperands=false, or is outside the node selector)",
				len(obs.cluster.nodes), optedOutLabels(op.name), deployLabelPrefix)
			out = append(out, c)
			continue
		case ds == nil && op.name == gpuv1alpha1.OperandDriver && len(obs.noDriver) > 0:
			c.Message = "no GPU node with a supported OS (" + strings.Join(driveros.Supported, ", ") + ")"
			noDriverMessage(&c, obs.noDriver)
			out = append(out, c)
			continue
		case ds == nil:
			c.Message = "DaemonSet " + objectName(op.name) + " not created yet"
			out = append(out, c)
			continue
		}
		c.Desired, c.Ready = ds.Status.DesiredNumberScheduled, ds.Status.NumberReady
		switch {
		case ds.Status.ObservedGeneration < ds.Generation:
			c.Message = "DaemonSet controller has not seen the latest spec yet"
		case c.Desired == 0 && len(meant) > 0:
			c.Message = fmt.Sprintf("no pod placed on the %d GPU nodes meant for it (%s): does it tolerate their taints?", len(meant), namedList(meant))
		case c.Desired == 0:
			c.Message = "no GPU node to run on (nodes need nvidia.com/gpu.present=true, and no " + optedOutLabels(op.name) + ")"
		case c.Ready < c.Desired:
			c.Message = fmt.Sprintf("%d of %d pods ready", c.Ready, c.Desired)
		case op.onDelete || ds.Status.UpdatedNumberScheduled >= c.Desired:
			c.State, c.Message = componentStateReady, fmt.Sprintf("ready on %d nodes", c.Ready)
		default:
			c.Message = fmt.Sprintf("rolling out: %d of %d pods updated", ds.Status.UpdatedNumberScheduled, c.Desired)
		}
		if op.name == gpuv1alpha1.OperandDriver {
			driverUpgradeProgress(&c, meta.FindStatusCondition(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade), obs.upgrades)
			noDriverMessage(&c, obs.noDriver)
		}
		untoleratedMessage(&c, obs.untolerated[op.name])
		out = append(out, c)
	}
	for _, op := range off {
		out = append(out, gpuv1alpha1.ComponentStatus{Name: op.name, State: componentStateOff})
	}
	return out
}

// meantNodes names the GPU nodes the operand is meant to run on (meantFor).
func meantNodes(cp *gpuv1alpha1.ClusterPolicy, op string, nodes []corev1.Node) []string {
	var out []string
	for i := range nodes {
		if meantFor(&nodes[i], cp, op) {
			out = append(out, nodes[i].Name)
		}
	}
	sort.Strings(out)
	return out
}

// untoleratedMessage names the GPU nodes meant for the operand that a
// taint it does not tolerate keeps it off, and holds it not ready: those
// nodes run without it, whatever its DaemonSet's counts say.
func untoleratedMessage(c *gpuv1alpha1.ComponentStatus, nodes []string) {
	if len(nodes) == 0 {
		return
	}
	c.State = componentStateWaiting
	c.Message += fmt.Sprintf("; kept off %d GPU nodes by a taint it does not tolerate (see spec.daemonsets.tolerations): %s", len(nodes), namedList(nodes))
}

// noDriverMessage names the GPU nodes that get no driver (their OS is
// unknown or unsupported) and holds the driver component not ready.
func noDriverMessage(c *gpuv1alpha1.ComponentStatus, noDriver []string) {
	if len(noDriver) == 0 {
		return
	}
	c.State = componentStateWaiting
	c.Message += fmt.Sprintf("; %d GPU nodes get no driver: %s", len(noDriver), namedList(noDriver))
}

// driverUpgradeProgress holds the driver component not ready while the
// driver upgrade controller's DriverUpgrade condition is False (upgrading,
// paused, or an invalid policy), with that condition's message: it names
// the failed, blocked and ignored nodes. Until that controller has written
// its condition, the claimed nodes' labels say the same in short.
func driverUpgradeProgress(c *gpuv1alpha1.ComponentStatus, cond *metav1.Condition, u upgradeCounts) {
	if cond != nil {
		if cond.Status == metav1.ConditionFalse {
			c.State = componentStateWaiting
			c.Message = cond.Reason + ": " + cond.Message
		}
		return
	}
	if len(u.inProgress) == 0 && len(u.failed) == 0 {
		return
	}
	c.State = componentStateWaiting
	c.Message = fmt.Sprintf("upgrading: %d nodes in progress, %d failed", len(u.inProgress), len(u.failed))
	if len(u.failed) > 0 {
		c.Message += fmt.Sprintf(" (%s; see label %s)", strings.Join(u.failed, ", "), gpuv1alpha1.LabelUpgradeState)
		if u.firstFailure != "" {
			c.Message += fmt.Sprintf("; %s: %s", u.failed[0], u.firstFailure)
		}
	}
}

// readiness sets state and the Ready condition from the spec's errors, the
// failed writes and the components, in that order.
func readiness(st *gpuv1alpha1.ClusterPolicyStatus, gpuNodes int32, invalid, writeErrs []string, generation int64) {
	var waiting []string
	for _, c := range st.Components {
		if c.Enabled && c.State != componentStateReady {
			waiting = append(waiting, c.Name+" ("+c.Message+")")
		}
	}
	st.State = gpuv1alpha1.PolicyNotReady
	switch {
	case len(invalid) > 0:
		setReady(st, generation, metav1.ConditionFalse, ReasonInvalidSpec,
			"invalid spec (nothing is written, and no driver upgrade starts, until it is fixed): "+strings.Join(invalid, "; "))
	case len(writeErrs) > 0:
		setReady(st, generation, metav1.ConditionFalse, ReasonApplyFailed, strings.Join(writeErrs, "; "))
	case gpuNodes == 0:
		setReady(st, generation, metav1.ConditionFalse, ReasonNoGPUNodes,
			"no node has GPUs yet (label nvidia.com/gpu.present=true, set from the node agent's inventory)")
	case len(waiting) > 0:
		setReady(st, generation, metav1.ConditionFalse, ReasonComponentsWait,
			fmt.Sprintf("%d of %d components not ready: %s", len(waiting), countEnabled(st.Components), strings.Join(waiting, ", ")))
	default:
		st.State = gpuv1alpha1.PolicyReady
		setReady(st, generation, metav1.ConditionTrue, ReasonAllReady,
			fmt.Sprintf("%d components ready on %d GPU nodes", countEnabled(st.Components), gpuNodes))
	}
}

func readyReason(st *gpuv1alpha1.ClusterPolicyStatus) string {
	if c := meta.FindStatusCondition(st.Conditions, conditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// setReady is the one way the Ready condition is set.
func setReady(st *gpuv1alpha1.ClusterPolicyStatus, generation int64, status metav1.ConditionStatus, reason, message string) {
	setCondition(st, conditionReady, generation, status, reason, message)
}

func setCondition(st *gpuv1alpha1.ClusterPolicyStatus, t string, generation int64, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: status,
		Reason: reason, Message: apply.TruncateMessage(message), ObservedGeneration: generation})
}

// stalledReasons are Ready's reasons only a person can clear.
var stalledReasons = map[string]bool{ReasonInvalidSpec: true, ReasonIgnored: true}

// settle sets kstatus's Reconciling and Stalled from Ready, so that kstatus
// reads a ready stack Current, one rolling out (or waiting for GPU nodes,
// or retrying a failed write) InProgress, and an invalid or ignored policy
// Failed.
func settle(st *gpuv1alpha1.ClusterPolicyStatus, generation int64) {
	reason, msg, ready := "Unknown", "not looked at yet", false
	if c := meta.FindStatusCondition(st.Conditions, conditionReady); c != nil {
		reason, msg, ready = c.Reason, c.Message, c.Status == metav1.ConditionTrue
	}
	switch {
	case ready:
		setCondition(st, conditionReconciling, generation, metav1.ConditionFalse, reason, "every component is rolled out")
		setCondition(st, conditionStalled, generation, metav1.ConditionFalse, reason, "nothing in the way")
	case stalledReasons[reason]:
		setCondition(st, conditionReconciling, generation, metav1.ConditionFalse, reason, "waiting for a person: see Stalled")
		setCondition(st, conditionStalled, generation, metav1.ConditionTrue, reason, msg)
	default:
		setCondition(st, conditionReconciling, generation, metav1.ConditionTrue, reason, msg)
		setCondition(st, conditionStalled, generation, metav1.ConditionFalse, reason, "nothing in the way")
	}
}

func countEnabled(cs []gpuv1alpha1.ComponentStatus) int {
	n := 0
	for _, c := range cs {
		if c.Enabled {
			n++
		}
	}
	return n
}

// countsOnly reports whether cur differs from old in counts and messages
// only: such a write may wait, so that a large rollout costs one status
// write per apply.CoalesceInterval instead of one per DaemonSet status
// change (a rollout on 500 nodes changes DaemonSet status thousands of
// times).
func countsOnly(old, cur *gpuv1alpha1.ClusterPolicyStatus) bool {
	if cur.State != old.State || cur.GPUNodes != old.GPUNodes || cur.ObservedGeneration != old.ObservedGeneration ||
		!apply.SameConditions(old.Conditions, cur.Conditions) {
		return false
	}
	for _, c := range cur.Components {
		i := findComponent(old.Components, c.Name)
		if i < 0 {
			return false
		}
		if o := old.Components[i]; o.State != c.State || o.Enabled != c.Enabled || o.Version != c.Version {
			return false
		}
	}
	return true
}

func findComponent(cs []gpuv1alpha1.ComponentStatus, name string) int {
	for i := range cs {
		if cs[i].Name == name {
			return i
		}
	}
	return -1
}

// summarizeMIG counts MIG-capable, MIG-enabled and pending nodes and the
// devices by profile; node lists are sorted and capped at maxListed.
func summarizeMIG(nodes []gpuv1alpha1.GPUNode, states migStates) *gpuv1alpha1.MIGSummary {
	m := &gpuv1alpha1.MIGSummary{ConfigPending: states.pending, ConfigSuccess: states.success, ConfigFailed: states.failed,
		FailureMessage: apply.TruncateMessage(states.firstFailure)}
	for i := range nodes {
		capable, enabled, pending := false, false, false
		for _, g := range nodes[i].Status.GPUs {
			if g.MIG == nil {
				continue
			}
			capable = capable || g.MIG.Capable
			enabled = enabled || g.MIG.CurrentMode == gpuv1alpha1.MIGEnabled
			pending = pending || (g.MIG.PendingMode != "" && g.MIG.PendingMode != g.MIG.CurrentMode)
			if g.MIG.CurrentMode != gpuv1alpha1.MIGEnabled {
				continue
			}
			for _, d := range g.MIG.Devices {
				if m.Devices == nil {
					m.Devices = map[string]int32{}
				}
				m.Devices[d.Profile]++
			}
		}
		if capable {
			m.CapableNodes++
		}
		if enabled {
			m.EnabledNodes++
		}
		if pending {
			m.PendingNodes = append(m.PendingNodes, nodes[i].Name)
		}
	}
	m.PendingNodes = capList(m.PendingNodes)
	m.FailedNodes = capList(append([]string(nil), states.failedNodes...))
	return m
}

func capList(s []string) []string {
	sort.Strings(s)
	if len(s) > maxListed {
		return s[:maxListed]
	}
	return s
}
