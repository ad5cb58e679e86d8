package clusterpolicy

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// rolledOut is a DaemonSet of generation 1 ready on n nodes.
func rolledOut(n int32) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: 1}, Status: appsv1.DaemonSetStatus{
		ObservedGeneration: 1, DesiredNumberScheduled: n, NumberReady: n, UpdatedNumberScheduled: n}}
}

func allRolledOut(n int32) map[string]*appsv1.DaemonSet {
	out := map[string]*appsv1.DaemonSet{}
	for _, op := range operands {
		out[op.name] = rolledOut(n)
	}
	return out
}

func TestStatus(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Generation: 3}}
	stale := rolledOut(2)
	stale.Generation = 2
	rolling := rolledOut(2)
	rolling.Status.UpdatedNumberScheduled = 1
	with := func(op string, ds *appsv1.DaemonSet) map[string]*appsv1.DaemonSet {
		m := allRolledOut(2)
		if ds == nil {
			delete(m, op)
		} else {
			m[op] = ds
		}
		return m
	}
	tests := []struct {
		name      string
		obs       observed
		writeErrs []string
		state     gpuv1alpha1.ClusterPolicyState
		reason    string
		message   string // in the Ready condition
	}{
		{"ready", observed{active: "default", gpuNodes: 2, daemonSets: allRolledOut(2)}, nil,
			gpuv1alpha1.PolicyReady, ReasonAllReady, "6 components ready on 2 GPU nodes"},
		{"no GPU nodes", observed{active: "default", daemonSets: allRolledOut(0)}, nil,
			gpuv1alpha1.PolicyNotReady, ReasonNoGPUNodes, "no node has GPUs yet"},
		{"write failed", observed{active: "default", gpuNodes: 2, daemonSets: allRolledOut(2)}, []string{"applying DaemonSet x: boom"},
			gpuv1alpha1.PolicyNotReady, ReasonApplyFailed, "boom"},
		{"not created", observed{active: "default", gpuNodes: 2, daemonSets: with("dcgm-exporter", nil)}, nil,
			gpuv1alpha1.PolicyNotReady, ReasonComponentsWait, "dcgm-exporter (DaemonSet loom-dcgm-exporter not created yet)"},
		{"spec not seen", observed{active: "default", gpuNodes: 2, daemonSets: with("device-plugin", stale)}, nil,
			gpuv1alpha1.PolicyNotReady, ReasonComponentsWait, "has not seen the latest spec"},
		{"rolling", observed{active: "default", gpuNodes: 2, daemonSets: with("mig-manager", rolling)}, nil,
			gpuv1alpha1.PolicyNotReady, ReasonComponentsWait, "rolling out: 1 of 2 pods updated"},
		{"driver OnDelete counts as rolled out", observed{active: "default", gpuNodes: 2, daemonSets: with("driver", rolling)}, nil,
			gpuv1alpha1.PolicyReady, ReasonAllReady, "6 components ready"},
		{"driver upgrading", observed{active: "default", gpuNodes: 2, daemonSets: allRolledOut(2),
			upgrades: upgradeCounts{inProgress: []string{"a"}, failed: []string{"b"}, firstFailure: "GPU pods still on the node"}}, nil,
			gpuv1alpha1.PolicyNotReady, ReasonComponentsWait, "upgrading: 1 nodes in progress, 1 failed (b; see label nvidia.com/gpu-driver-upgrade-state); b: GPU pods still on the node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := status(cp, tt.obs, tt.writeErrs)
			c := meta.FindStatusCondition(st.Conditions, "Ready")
			if st.State != tt.state || c == nil || c.Reason != tt.reason || !strings.Contains(c.Message, tt.message) || c.ObservedGeneration != 3 {
				t.Errorf("state %s, condition %+v; want %s, %s, %q", st.State, c, tt.state, tt.reason, tt.message)
			}
			if st.ObservedGeneration != 3 || st.GPUNodes != tt.obs.gpuNodes || len(st.Components) != len(operands) || st.MIG == nil {
				t.Errorf("status %+v", st)
			}
		})
	}
}

func TestIgnoredStatus(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "second", Generation: 1}}
	cp.Status.Components = []gpuv1alpha1.ComponentStatus{{Name: "driver"}}
	st := ignoredStatus(cp, "default")
	c := meta.FindStatusCondition(st.Conditions, "Ready")
	if st.State != gpuv1alpha1.PolicyIgnored || st.ActivePolicy != "default" || st.Components != nil || c == nil || c.Reason != ReasonIgnored {
		t.Errorf("ignored status %+v", st)
	}
	if len(cp.Status.Components) != 1 {
		t.Error("ignoredStatus changed the policy it was given")
	}
}

// Only counts and messages may wait; a state, a condition or a component
// that changes is written at once.
func TestCountsOnly(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	rolling := allRolledOut(4)
	rolling["mig-manager"].Status.UpdatedNumberScheduled = 1
	old := status(cp, observed{active: "default", gpuNodes: 4, daemonSets: rolling}, nil)
	more := allRolledOut(4)
	more["mig-manager"].Status.UpdatedNumberScheduled = 2
	if cur := status(cp, observed{active: "default", gpuNodes: 4, daemonSets: more}, nil); !countsOnly(old, cur) {
		t.Error("one more pod updated is not a count-only change")
	}
	for name, obs := range map[string]observed{
		"ready":        {active: "default", gpuNodes: 4, daemonSets: allRolledOut(4)},
		"node count":   {active: "default", gpuNodes: 5, daemonSets: rolling},
		"write failed": {active: "default", gpuNodes: 4, daemonSets: rolling},
	} {
		var errs []string
		if name == "write failed" {
			errs = []string{"boom"}
		}
		if cur := status(cp, obs, errs); countsOnly(old, cur) {
			t.Errorf("%s: counted as a count-only change", name)
		}
	}
}

// A spec the API server let through (stored before a rule, or beyond what
// CEL checks) is Ready=False, InvalidSpec, naming each field, ahead of
// failed writes and whatever the operands do.
func TestStatusInvalidSpec(t *testing.T) {
	zero := intstr.FromInt32(0)
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Generation: 2}}
	cp.Spec.Driver.UpgradePolicy = gpuv1alpha1.DriverUpgradePolicy{MaxUnavailable: &zero,
		Drain: &gpuv1alpha1.DrainSpec{PodSelector: "app in ("}}
	cp.Spec.DCGMExporter.NodeSelector = map[string]string{strings.Repeat("k", 64): "v"}
	obs := observed{active: "default", gpuNodes: 2, daemonSets: allRolledOut(2)}
	for _, writeErrs := range [][]string{nil, {"applying DaemonSet x: boom"}} {
		st := status(cp, obs, writeErrs)
		c := meta.FindStatusCondition(st.Conditions, "Ready")
		if st.State != gpuv1alpha1.PolicyNotReady || c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonInvalidSpec {
			t.Fatalf("state %s, condition %+v", st.State, c)
		}
		for _, want := range []string{"spec.driver.upgradePolicy.maxUnavailable", "spec.driver.upgradePolicy.drain.podSelector: Invalid value: \"app in (\"",
			"spec.dcgmExporter.nodeSelector[" + strings.Repeat("k", 64) + "]", "no driver upgrade starts"} {
			if !strings.Contains(c.Message, want) {
				t.Errorf("message %q lacks %q", c.Message, want)
			}
		}
		if again := status(cp, obs, writeErrs); meta.FindStatusCondition(again.Conditions, "Ready").Message != c.Message {
			t.Error("the message changes between passes")
		}
	}
	cp.Spec = gpuv1alpha1.ClusterPolicySpec{}
	if c := meta.FindStatusCondition(status(cp, obs, nil).Conditions, "Ready"); c.Reason != ReasonAllReady {
		t.Errorf("fixed spec: %+v", c)
	}
}

// Only the nodes the policy's driver upgrade claimed count: an unknown
// state value and another owner's label (GPU Operator's leftovers) are the
// driver upgrade's to name, not in progress here.
func TestCountUpgradesOnlyClaimed(t *testing.T) {
	node := func(name, state, claim string) metav1.PartialObjectMetadata {
		n := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{gpuv1alpha1.LabelUpgradeState: state}}}
		if claim != "" {
			n.Annotations = map[string]string{gpuv1alpha1.AnnotationClaim: claim, gpuv1alpha1.AnnotationFailure: "timed out"}
		}
		return n
	}
	u := countUpgrades([]metav1.PartialObjectMetadata{
		node("a", "upgrade-donе" /* a Cyrillic е */, "p"), node("b", gpuv1alpha1.DrainRequired, "p"), node("c", gpuv1alpha1.UpgradeDone, "p"),
		node("d", gpuv1alpha1.DrainRequired, ""), node("e", gpuv1alpha1.UpgradeFailed, "other"), node("f", gpuv1alpha1.UpgradeFailed, "p"),
	}, "p")
	if strings.Join(u.failed, ",") != "f" || strings.Join(u.inProgress, ",") != "b" || u.firstFailure != "timed out" {
		t.Errorf("counts %+v", u)
	}
}

// The driver component follows the driver upgrade's condition: paused
// holds it with that message and turns Ready's reason to UpgradePaused.
func TestDriverComponentFollowsUpgradeCondition(t *testing.T) {
	c := gpuv1alpha1.ComponentStatus{Name: gpuv1alpha1.OperandDriver, State: componentStateReady, Message: "ready on 3 nodes"}
	driverUpgradeProgress(&c, &metav1.Condition{Type: gpuv1alpha1.ConditionDriverUpgrade, Status: metav1.ConditionFalse,
		Reason: gpuv1alpha1.ReasonUpgradePaused, Message: "1 failed (maxFailures 1): n1"}, upgradeCounts{})
	if c.State != componentStateWaiting || c.Message != "UpgradePaused: 1 failed (maxFailures 1): n1" {
		t.Errorf("paused: %+v", c)
	}
	c = gpuv1alpha1.ComponentStatus{State: componentStateReady, Message: "ready on 3 nodes"}
	driverUpgradeProgress(&c, &metav1.Condition{Status: metav1.ConditionTrue, Reason: gpuv1alpha1.ReasonUpgradeUpToDate}, upgradeCounts{inProgress: []string{"x"}})
	if c.State != componentStateReady {
		t.Errorf("up to date: %+v", c)
	}
}

// A node rebooting to apply its MIG layout is still applying it: pending,
// like one whose MIG manager has not started; the failed one is named.
func TestCountMIGStates(t *testing.T) {
	node := func(name, state string) metav1.PartialObjectMetadata {
		return metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			gpuv1alpha1.LabelMIGConfigState: state, gpuv1alpha1.LabelMIGConfig: "all-1g.10gb"}}}
	}
	m := countMIGStates([]metav1.PartialObjectMetadata{node("a", "pending"), node("b", "rebooting"), node("c", "success"), node("d", "failed"), node("e", "")})
	if m.pending != 2 || m.success != 1 || m.failed != 1 || len(m.failedNodes) != 1 || !strings.HasPrefix(m.firstFailure, "d: ") {
		t.Fatalf("%+v", m)
	}
}

// Hosts with their own driver opt their nodes out of Loom's
// (nvidia.com/gpu.deploy.driver=false, or =pre-installed), on an OS Loom has no driver image
// for as well; nodes may opt out of other operands too. An operand meant
// for no GPU node has nothing to roll out: it is ready, the rest of the
// stack rolls out and the policy goes Ready. An operand meant for nodes
// it places no pod on still waits, naming them.
func TestStatusOptedOutOperands(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Generation: 1}}
	node := func(name, osImage string, optOut ...string) corev1.Node {
		l := map[string]string{gpuv1alpha1.LabelPresent: "true"}
		for _, op := range optOut {
			l["nvidia.com/gpu.deploy."+op] = "false"
		}
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: osImage}}}
	}
	hostDrivers := []corev1.Node{node("host-a", "Ubuntu 22.04.4 LTS", "driver", "mig-manager"),
		node("host-b", "Debian GNU/Linux 12 (bookworm)", "driver", "mig-manager")}
	p := desired(cp, "loom-system", cluster{nodes: hostDrivers})
	if len(p.noDriver) != 0 {
		t.Errorf("nodes that opted out of the driver named as getting none: %v", p.noDriver)
	}
	for name, ds := range map[string]map[string]*appsv1.DaemonSet{
		"driver DaemonSet placing no pod": func() map[string]*appsv1.DaemonSet {
			m := allRolledOut(2)
			m["driver"], m["mig-manager"] = rolledOut(0), rolledOut(0)
			return m
		}(),
		"no driver DaemonSet": func() map[string]*appsv1.DaemonSet {
			m := allRolledOut(2)
			delete(m, "driver")
			m["mig-manager"] = rolledOut(0)
			return m
		}(),
	} {
		st := status(cp, observed{active: "default", gpuNodes: 2, daemonSets: ds, cluster: cluster{nodes: hostDrivers}, noDriver: p.noDriver}, nil)
		if c := meta.FindStatusCondition(st.Conditions, "Ready"); st.State != gpuv1alpha1.PolicyReady || c == nil || c.Reason != ReasonAllReady {
			t.Errorf("%s: state %s, Ready %+v; want ready", name, st.State, c)
		}
		for _, c := range st.Components {
			want := "nvidia.com/gpu.deploy." + c.Name + "=false"
			if c.Name == "driver" {
				want += " or =pre-installed" // a host with its own driver, as GPU Operator and Loom's labeller mark it
			}
			if (c.Name == "driver" || c.Name == "mig-manager") && (c.State != "ready" || !strings.Contains(c.Message, want)) {
				t.Errorf("%s: component %+v", name, c)
			}
		}
	}
	// One node still wants the MIG manager, and gets no pod: waiting.
	mixed := []corev1.Node{hostDrivers[0], node("gpu-c", "Ubuntu 22.04.4 LTS", "driver")}
	ds := allRolledOut(2)
	ds["driver"], ds["mig-manager"] = rolledOut(0), rolledOut(0)
	st := status(cp, observed{active: "default", gpuNodes: 2, daemonSets: ds, cluster: cluster{nodes: mixed}}, nil)
	i := findComponent(st.Components, "mig-manager")
	if st.State != gpuv1alpha1.PolicyNotReady || st.Components[i].State != "notReady" || !strings.Contains(st.Components[i].Message, "gpu-c") {
		t.Errorf("mig-manager meant for gpu-c, placed nowhere: state %s, %+v", st.State, st.Components[i])
	}
}
