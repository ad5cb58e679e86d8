package driverupgrade

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// driverTemplate is a driver DaemonSet's pod template as the ClusterPolicy
// builds it: GPU-present nodes that did not opt out, tolerating
// nvidia.com/gpu.
func driverTemplate() corev1.PodSpec {
	return corev1.PodSpec{
		Tolerations: []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: gpuv1alpha1.LabelPresent, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}},
				{Key: "nvidia.com/gpu.deploy.operands", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"false"}},
				{Key: "nvidia.com/gpu.deploy.driver", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"false"}},
			}}}}}},
	}
}

// A GPU node no driver DaemonSet will ever run on (it opted out of Loom's
// driver, runs a host driver, carries a taint the driver does not
// tolerate) waits for no driver pod: the DaemonSets' own rules say so,
// with the tolerations the DaemonSet controller adds to every daemon pod.
func TestDriverPlaces(t *testing.T) {
	gpu := func(labels map[string]string, taints ...corev1.Taint) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}}}
		for k, v := range labels {
			n.Labels[k] = v
		}
		n.Spec.Taints = taints
		return n
	}
	withSelector := driverTemplate()
	withSelector.NodeSelector = map[string]string{"pool": "gpu"}
	tests := []struct {
		name  string
		node  *corev1.Node
		specs []corev1.PodSpec
		want  bool
	}{
		{"a GPU node", gpu(nil), []corev1.PodSpec{driverTemplate()}, true},
		{"no driver DaemonSet", gpu(nil), nil, false},
		{"opted out of the driver", gpu(map[string]string{"nvidia.com/gpu.deploy.driver": "false"}), []corev1.PodSpec{driverTemplate()}, false},
		{"opted out of every operand", gpu(map[string]string{"nvidia.com/gpu.deploy.operands": "false"}), []corev1.PodSpec{driverTemplate()}, false},
		{"outside the driver's node selector", gpu(nil), []corev1.PodSpec{withSelector}, false},
		{"in the driver's node selector", gpu(map[string]string{"pool": "gpu"}), []corev1.PodSpec{withSelector}, true},
		{"another tool's NoSchedule taint", gpu(nil, corev1.Taint{Key: "dedicated", Value: "infer", Effect: corev1.TaintEffectNoSchedule}),
			[]corev1.PodSpec{driverTemplate()}, false},
		{"a PreferNoSchedule taint", gpu(nil, corev1.Taint{Key: "dedicated", Effect: corev1.TaintEffectPreferNoSchedule}), []corev1.PodSpec{driverTemplate()}, true},
		{"nvidia.com/gpu tolerated", gpu(nil, corev1.Taint{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}), []corev1.PodSpec{driverTemplate()}, true},
		{"cordoned: daemon pods tolerate it", gpu(nil, corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}),
			[]corev1.PodSpec{driverTemplate()}, true},
		{"NotReady: daemon pods tolerate it", gpu(nil, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}),
			[]corev1.PodSpec{driverTemplate()}, true},
		{"NotReady or unreachable (NoSchedule): the node's health, not its placement", gpu(nil, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule},
			corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule}), []corev1.PodSpec{driverTemplate()}, true},
		{"one of two DaemonSets", gpu(nil), []corev1.PodSpec{withSelector, driverTemplate()}, true},
	}
	for _, tt := range tests {
		if got := driverPlaces(tt.specs, tt.node); got != tt.want {
			t.Errorf("%s: driverPlaces = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// Such a node is not "waiting for the DaemonSet to place its driver pod"
// for ever, and does not count among the nodes that should run the wanted
// driver; nor does it keep the pass following the DaemonSets' pods.
func TestConditionNodesWithoutLoomsDriver(t *testing.T) {
	one := gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](1)}
	hostDriver := func(v *nodeView) { v.unplaced = true }
	pl := plan([]nodeView{gpuNode("a", "", wanted), gpuNode("b", "", "", hostDriver)}, one, policy, false)
	st, reason, msg := condition(pl.summary, nil)
	want := "1 of 1 GPU nodes run the wanted driver; 1 GPU nodes run no driver of this policy (no driver DaemonSet selects them: " +
		"nvidia.com/gpu.deploy.driver=false or =pre-installed, a node selector, a taint, or an OS without a driver): b"
	if st != metav1.ConditionTrue || reason != gpuv1alpha1.ReasonUpgradeUpToDate || msg != want {
		t.Errorf("condition = %s %s %q\nwant True UpToDate %q", st, reason, msg, want)
	}
	if pl.summary.awaitsDriverPods() {
		t.Error("a node no DaemonSet selects keeps the pass following the DaemonSets' pods")
	}
	// A node that left the DaemonSets' placement mid-upgrade, or after
	// failing, is named the same way (and the failure does not pause the
	// rollout), as is an idle node on an older driver no DaemonSet will
	// replace; one that runs the wanted driver is up to date.
	pl = plan([]nodeView{gpuNode("a", "", wanted, hostDriver), gpuNode("b", gpuv1alpha1.DrainRequired, "old", hostDriver),
		gpuNode("c", gpuv1alpha1.UpgradeFailed, "old", hostDriver, ann(gpuv1alpha1.AnnotationFailedTemplate, wanted)), gpuNode("d", "", "old", hostDriver)},
		gpuv1alpha1.DriverUpgradePolicy{}, policy, false)
	st, reason, msg = condition(pl.summary, nil)
	want = "1 of 1 GPU nodes run the wanted driver; 3 GPU nodes run no driver of this policy (no driver DaemonSet selects them: " +
		"nvidia.com/gpu.deploy.driver=false or =pre-installed, a node selector, a taint, or an OS without a driver): b, c, d"
	if st != metav1.ConditionTrue || reason != gpuv1alpha1.ReasonUpgradeUpToDate || msg != want {
		t.Errorf("condition = %s %s %q\nwant True UpToDate %q", st, reason, msg, want)
	}
}

// perOS is a per-OS driver DaemonSet's pod spec as the ClusterPolicy
// builds it: the driver's template, restricted to the OS's nodes by NFD's
// os_release labels and by the names of nodes without them.
func perOS(id, version string, names ...string) corev1.PodSpec {
	spec := driverTemplate()
	required := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	base := required.NodeSelectorTerms[0].MatchExpressions
	terms := []corev1.NodeSelectorTerm{{MatchExpressions: append(slices.Clone(base),
		corev1.NodeSelectorRequirement{Key: gpuv1alpha1.LabelOSReleaseID, Operator: corev1.NodeSelectorOpIn, Values: []string{id}},
		corev1.NodeSelectorRequirement{Key: gpuv1alpha1.LabelOSReleaseVersionID, Operator: corev1.NodeSelectorOpIn, Values: []string{version}})}}
	for _, n := range names {
		terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: slices.Clone(base),
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}})
	}
	required.NodeSelectorTerms = terms
	return spec
}

// A node leaves its upgrade for leaving the driver's placement, not
// because its OS's DaemonSet is missing for a moment (deleted and being
// recreated, or not yet made for a node whose OS changed): only the per-OS
// restriction keeping it out, and its OS having a driver, it waits.
func TestDriverLeft(t *testing.T) {
	node := func(name, id, version, osImage string, f ...func(*corev1.Node)) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}}}
		if id != "" {
			n.Labels[gpuv1alpha1.LabelOSReleaseID], n.Labels[gpuv1alpha1.LabelOSReleaseVersionID] = id, version
		}
		n.Status.NodeInfo.OSImage, n.Status.NodeInfo.KernelVersion = osImage, "5.15.0-105-generic"
		for _, o := range f {
			o(n)
		}
		return n
	}
	optOut := func(n *corev1.Node) { n.Labels["nvidia.com/gpu.deploy.driver"] = "false" }
	taint := func(n *corev1.Node) {
		n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "infer", Effect: corev1.TaintEffectNoSchedule}}
	}
	noKernel := func(n *corev1.Node) { n.Status.NodeInfo.KernelVersion = "" }
	rhel, ubuntu := perOS("rhel", "9.4"), perOS("ubuntu", "22.04", "u-by-name")
	// A DaemonSet whose nodes all go by their hostname label.
	byHost := driverTemplate()
	hostTerm := &byHost.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0]
	hostTerm.MatchExpressions = append(slices.Clone(hostTerm.MatchExpressions),
		corev1.NodeSelectorRequirement{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"u-by-host"}})
	hostname := func(n *corev1.Node) { n.Labels[corev1.LabelHostname] = n.Name }
	withSelector := driverTemplate()
	withSelector.NodeSelector = map[string]string{"pool": "gpu"}
	// The ClusterPolicy's DaemonSets place the nodes it labels with their
	// target.
	byTarget := driverTemplate()
	targetTerm := &byTarget.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0]
	targetTerm.MatchExpressions = append(slices.Clone(targetTerm.MatchExpressions),
		corev1.NodeSelectorRequirement{Key: gpuv1alpha1.LabelDriverTarget, Operator: corev1.NodeSelectorOpIn, Values: []string{"ubuntu22.04"}})
	target := func(v string) func(*corev1.Node) {
		return func(n *corev1.Node) { n.Labels[gpuv1alpha1.LabelDriverTarget] = v }
	}
	tests := []struct {
		name        string
		node        *corev1.Node
		specs       []corev1.PodSpec
		precompiled bool
		want        bool
	}{
		{"placed by its OS's DaemonSet", node("u", "ubuntu", "22.04", ""), []corev1.PodSpec{rhel, ubuntu}, false, false},
		{"placed by name", node("u-by-name", "", "", "Ubuntu 22.04.4 LTS"), []corev1.PodSpec{rhel, ubuntu}, false, false},
		{"no driver DaemonSet at all", node("u", "ubuntu", "22.04", ""), nil, false, false},
		{"its OS's DaemonSet is being recreated", node("u", "ubuntu", "22.04", ""), []corev1.PodSpec{rhel}, false, false},
		{"its OS changed, the new OS's DaemonSet is still to come", node("u", "ubuntu", "24.04", ""), []corev1.PodSpec{rhel, ubuntu}, false, false},
		{"no NFD labels, its DaemonSet does not name it yet", node("u-new", "", "", "Ubuntu 22.04.4 LTS"), []corev1.PodSpec{rhel, ubuntu}, false, false},
		{"placed by hostname", node("u-by-host", "", "", "Ubuntu 22.04.4 LTS", hostname), []corev1.PodSpec{byHost}, false, false},
		{"no NFD labels, its DaemonSet does not list its hostname yet", node("u-new", "", "", "Ubuntu 22.04.4 LTS", hostname), []corev1.PodSpec{byHost}, false, false},
		{"placed by its driver-target label", node("u", "", "", "Ubuntu 22.04.4 LTS", target("ubuntu22.04")), []corev1.PodSpec{byTarget}, false, false},
		{"not labelled with its target yet", node("u-new", "", "", "Ubuntu 22.04.4 LTS"), []corev1.PodSpec{byTarget}, false, false},
		{"its OS changed, its label not yet", node("u", "", "", "Ubuntu 24.04.1 LTS", target("ubuntu22.04")), []corev1.PodSpec{byTarget}, false, false},
		{"labelled, opted out", node("u", "", "", "Ubuntu 22.04.4 LTS", target("ubuntu22.04"), optOut), []corev1.PodSpec{byTarget}, false, true},
		{"its OS's DaemonSet missing, opted out", node("u", "ubuntu", "22.04", "", optOut), []corev1.PodSpec{rhel}, false, true},
		{"its OS's DaemonSet missing, a taint the driver does not tolerate", node("u", "ubuntu", "22.04", "", taint), []corev1.PodSpec{rhel}, false, true},
		{"an OS without a driver", node("r", "rocky", "9.4", ""), []corev1.PodSpec{rhel, ubuntu}, false, true},
		{"an OS not known", node("d", "", "", "Debian GNU/Linux 12 (bookworm)"), []corev1.PodSpec{rhel, ubuntu}, false, true},
		{"precompiled, no kernel version", node("u", "ubuntu", "24.04", "", noKernel), []corev1.PodSpec{rhel}, true, true},
		{"precompiled, its kernel's DaemonSet is still to come", node("u", "ubuntu", "24.04", ""), []corev1.PodSpec{rhel}, true, false},
		{"one DaemonSet for every OS, outside its node selector", node("u", "ubuntu", "22.04", ""), []corev1.PodSpec{withSelector}, false, true},
	}
	for _, tt := range tests {
		if got := driverLeft(tt.specs, tt.node, tt.precompiled); got != tt.want {
			t.Errorf("%s: driverLeft = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A node whose OS changed runs two driver pods for a while, the old OS's
// DaemonSet's and the new OS's; its driver pod (whose DaemonSet's template
// the upgrade follows) is the one whose DaemonSet places the node, however
// the pods are listed, and the choice is the same every pass.
func TestDriverOf(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "u", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}}}
	t0 := metav1.Now()
	t1 := metav1.NewTime(t0.Add(time.Minute))
	pod := func(name, ds string, created metav1.Time) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created,
			OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: ds, Controller: ptr.To(true)}}}}
	}
	old, nw := pod("old", "loom-driver-ubuntu22.04", t0), pod("new", "loom-driver-ubuntu24.04", t1)
	oldNewer := pod("old", "loom-driver-ubuntu22.04", t1)
	stray := pod("stray", "someone-else", t1)
	bothName := map[string]corev1.PodSpec{"loom-driver-ubuntu22.04": perOS("ubuntu", "22.04", "u"), "loom-driver-ubuntu24.04": perOS("ubuntu", "24.04", "u")}
	newNames := map[string]corev1.PodSpec{"loom-driver-ubuntu22.04": perOS("ubuntu", "22.04"), "loom-driver-ubuntu24.04": perOS("ubuntu", "24.04", "u")}
	oldNames := map[string]corev1.PodSpec{"loom-driver-ubuntu22.04": perOS("ubuntu", "22.04", "u"), "loom-driver-ubuntu24.04": perOS("ubuntu", "24.04")}
	newOnly := map[string]corev1.PodSpec{"loom-driver-ubuntu24.04": perOS("ubuntu", "24.04", "u")}
	tests := []struct {
		name  string
		pods  []*corev1.Pod
		specs map[string]corev1.PodSpec
		want  string
	}{
		{"no pod", nil, newNames, ""},
		{"one pod", []*corev1.Pod{old}, newNames, "old"},
		{"the new OS's DaemonSet names it, listed first", []*corev1.Pod{nw, oldNewer}, newNames, "new"},
		{"the new OS's DaemonSet names it, listed last", []*corev1.Pod{oldNewer, nw}, newNames, "new"},
		{"the old OS's DaemonSet still names it alone", []*corev1.Pod{old, nw}, oldNames, "old"},
		{"the old OS's DaemonSet deleted", []*corev1.Pod{oldNewer, nw}, newOnly, "new"},
		{"both name it: the newest, listed first", []*corev1.Pod{nw, old}, bothName, "new"},
		{"both name it: the newest, listed last", []*corev1.Pod{old, nw}, bothName, "new"},
		{"another owner's pod", []*corev1.Pod{nw, stray}, newNames, "new"},
	}
	for _, tt := range tests {
		got := ""
		if p := driverOf(tt.pods, node, tt.specs); p != nil {
			got = p.Name
		}
		if got != tt.want {
			t.Errorf("%s: driverOf = %q, want %q", tt.name, got, tt.want)
		}
	}
}
