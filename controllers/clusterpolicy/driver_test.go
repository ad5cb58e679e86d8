package clusterpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/daemonplace"
)

// A version naming its OS is one DaemonSet for every node; a plain one
// splits by OS, and by OS and kernel when precompiled.
func TestDriverGroups(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	groups, noDriver := driverGroups(cp, testFleet().nodes)
	if len(groups) != 2 || groups[0].target != "rhel9.4" || groups[1].target != "ubuntu22.04" || groups[1].tag != "570.172.08-ubuntu22.04" {
		t.Errorf("groups %+v", groups)
	}
	if len(noDriver) != 2 {
		t.Errorf("no driver %v", noDriver)
	}
	cp.Spec.Driver.Image.Version = "570.172.08-ubuntu22.04"
	if groups, noDriver := driverGroups(cp, testFleet().nodes); len(groups) != 1 || groups[0].target != "" || len(noDriver) != 0 {
		t.Errorf("suffixed version: %+v %v", groups, noDriver)
	}
	cp.Spec.Driver.Image.Version, cp.Spec.Driver.UsePrecompiled = "", true
	groups, _ = driverGroups(cp, testFleet().nodes)
	if len(groups) != 2 || groups[1].tag != "570-5.15.0-105-generic-ubuntu22.04" || len(groups[1].nodes) != 2 {
		t.Errorf("precompiled: %+v", groups)
	}
	if long := dnsSafe("ubuntu22.04-" + string(make([]byte, 80))); len(long) > 50 {
		t.Errorf("dnsSafe kept %d characters", len(long))
	}
}

// Precompiled drivers name their DaemonSet after the OS and kernel: two
// kernels that differ only in what a name cannot hold get a DaemonSet
// each, each with its own kernel's image; a kernel no image tag can hold
// gives that node no driver, saying why, instead of a DaemonSet whose
// pods cannot pull.
func TestPrecompiledKernelsNameTheirOwnDaemonSet(t *testing.T) {
	node := func(name, kernel string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: "Ubuntu 22.04.4 LTS", KernelVersion: kernel}}}
	}
	cp := &gpuv1alpha1.ClusterPolicy{}
	cp.Spec.Driver.UsePrecompiled = true
	long := "5.15.0-" + strings.Repeat("x", 60)
	groups, noDriver := driverGroups(cp, []corev1.Node{
		node("a", "5.15.0-105-generic"), node("b", "5.15.0-105-Generic"), node("c", "5.15.0-105_generic"),
		node("d", "6.8.0-1015-gcp"), node("e", long+"-1"), node("f", long+"-2"),
		node("g", "6.1.21-v8+"), node("h", "6.1.0 rc1"), node("i", "6.1.0-"+strings.Repeat("y", 120)),
	})
	tags, targets := map[string]string{}, map[string]bool{}
	for _, g := range groups {
		if targets[g.target] {
			t.Errorf("two groups named %s", g.target)
		}
		targets[g.target] = true
		if len(g.target) > 50 || len(validation.IsDNS1123Subdomain("loom-driver-"+g.target)) > 0 || len(validation.IsValidLabelValue(g.target)) > 0 {
			t.Errorf("target %q is no name", g.target)
		}
		for _, n := range g.nodes {
			tags[n] = g.tag
		}
	}
	for n, kernel := range map[string]string{"a": "5.15.0-105-generic", "b": "5.15.0-105-Generic", "c": "5.15.0-105_generic",
		"d": "6.8.0-1015-gcp", "e": long + "-1", "f": long + "-2"} {
		if want := "570-" + kernel + "-ubuntu22.04"; tags[n] != want {
			t.Errorf("node %s gets %q, want %q", n, tags[n], want)
		}
	}
	if !targets["ubuntu22.04-6.8.0-1015-gcp"] {
		t.Errorf("a kernel no other shares changed its name: %v", targets)
	}
	if len(noDriver) != 3 || !strings.HasPrefix(noDriver[0], "g (kernel \"6.1.21-v8+\" makes no image tag") ||
		!strings.HasPrefix(noDriver[1], "h (kernel") || !strings.HasPrefix(noDriver[2], "i (kernel") {
		t.Errorf("no driver %q", noDriver)
	}
}

// Each GPU node is labelled with its driver's target, which alone places
// it: a node whose NFD labels lag an OS upgrade (they name the old OS, its
// osImage the new one) gets the new OS's driver, nodes without NFD's
// labels theirs, and no node is placed by two driver DaemonSets, checked
// by the DaemonSet controller's own matching; the API server takes them.
func TestDriverNodesByTargetLabel(t *testing.T) {
	nfd := func(id, v string) map[string]string {
		return map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelOSReleaseID: id, gpuv1alpha1.LabelOSReleaseVersionID: v}
	}
	node := func(name, osImage string, labels map[string]string) corev1.Node {
		if labels == nil {
			labels = map[string]string{gpuv1alpha1.LabelPresent: "true"}
		}
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: osImage, KernelVersion: "5.15.0-105-generic"}}}
	}
	nodes := []corev1.Node{
		node("jammy", "Ubuntu 22.04.4 LTS", nfd("ubuntu", "22.04")),
		node("jammy-no-image", "", nfd("ubuntu", "22.04")),
		node("upgraded", "Ubuntu 24.04.1 LTS", nfd("ubuntu", "22.04")),
		node("noble", "Ubuntu 24.04.1 LTS", nfd("ubuntu", "24.04")),
		node("bare-noble", "Ubuntu 24.04.1 LTS", nil),
		node("rhel-upgraded", "Red Hat Enterprise Linux 9.6 (Plow)", nfd("rhel", "9.4")),
		node("rhel", "Red Hat Enterprise Linux 9.4 (Plow)", nfd("rhel", "9.4")),
		node("debian-image", "Debian GNU/Linux 12 (bookworm)", nfd("ubuntu", "24.04")),
	}
	want := map[string]string{"jammy": "ubuntu22.04", "jammy-no-image": "ubuntu22.04", "upgraded": "ubuntu24.04",
		"noble": "ubuntu24.04", "bare-noble": "ubuntu24.04", "rhel-upgraded": "rhel9.6", "rhel": "rhel9.4", "debian-image": "ubuntu24.04"}
	for _, precompiled := range []bool{false, true} {
		cp := &gpuv1alpha1.ClusterPolicy{}
		cp.Spec.Driver.UsePrecompiled = precompiled
		groups, noDriver := driverGroups(cp, nodes)
		if len(noDriver) != 0 {
			t.Errorf("precompiled %v: no driver %v", precompiled, noDriver)
		}
		targets := driverTargets(groups)
		dss := driverDaemonSets(cp, "default", groups)
		for _, n := range nodes {
			if !strings.HasPrefix(targets[n.Name], want[n.Name]) {
				t.Errorf("precompiled %v: node %s gets target %q, want %s", precompiled, n.Name, targets[n.Name], want[n.Name])
			}
			var placed []string
			for _, labelled := range []bool{false, true} {
				if labelled {
					n.Labels[gpuv1alpha1.LabelDriverTarget] = targets[n.Name]
				}
				for _, ds := range dss {
					if daemonplace.Matches(&ds.Spec.Template.Spec, &n) {
						placed = append(placed, ds.Labels[gpuv1alpha1.LabelDriverTarget])
					}
				}
			}
			delete(n.Labels, gpuv1alpha1.LabelDriverTarget)
			if !slices.Equal(placed, []string{targets[n.Name]}) {
				t.Errorf("precompiled %v: node %s is placed by %v (before and after its label), want %s alone once labelled", precompiled, n.Name, placed, targets[n.Name])
			}
		}
		for _, ds := range dss {
			if err := env.Client.Create(context.Background(), ds, client.DryRunAll); err != nil {
				t.Errorf("the API server refuses %s: %v", ds.Name, err)
			}
		}
	}
}

// Nodes joining, leaving or changing their OS write their own label, never
// a driver DaemonSet: the DaemonSet of an OS is the same for one node as
// for 5,000, whatever their names, hostname labels or NFD labels.
func TestNodesJoiningWriteNoDriverDaemonSet(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	fleet := func(count int, nfd bool) []corev1.Node {
		out := make([]corev1.Node, count)
		for i := range out {
			name := fmt.Sprintf("ip-10-%d-%d-%d.ec2.internal", i/65536, i/256%256, i%256)
			l := map[string]string{gpuv1alpha1.LabelPresent: "true", corev1.LabelHostname: name}
			if nfd {
				l[gpuv1alpha1.LabelOSReleaseID], l[gpuv1alpha1.LabelOSReleaseVersionID] = "ubuntu", "22.04"
			}
			out[i] = corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l},
				Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: "Ubuntu 22.04.4 LTS"}}}
		}
		return out
	}
	daemonSet := func(nodes []corev1.Node) string {
		groups, _ := driverGroups(cp, nodes)
		b, err := json.Marshal(driverDaemonSets(cp, "default", groups))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	one := daemonSet(fleet(1, false))
	for _, count := range []int{2, 5000} {
		for _, nfd := range []bool{false, true} {
			if got := daemonSet(fleet(count, nfd)); got != one {
				t.Errorf("%d nodes (NFD labels %v) change the driver DaemonSet: %d bytes, %d for one node", count, nfd, len(got), len(one))
			}
		}
	}
}

// Only one driver pod runs on a node at a time: every driver DaemonSet
// (one per OS, the plain one) keeps its pod off a node where a driver pod
// of Loom's is, by any of them, terminating or not. An upgrade's deleted
// pod and a node whose OS changed otherwise run the old and the new driver
// side by side, each loading its kernel modules.
func TestOneDriverPodPerNode(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	groups, _ := driverGroups(cp, testFleet().nodes)
	sets := driverDaemonSets(cp, "loom-system", append(groups, driverGroup{tag: "570.172.08-ubuntu22.04"}))
	if len(sets) < 3 {
		t.Fatalf("%d driver DaemonSets, want the per-OS ones and the plain one", len(sets))
	}
	for _, ds := range sets {
		a := ds.Spec.Template.Spec.Affinity
		if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
			t.Errorf("%s: no required pod anti-affinity: %+v", ds.Name, a)
			continue
		}
		term := a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err != nil || term.TopologyKey != corev1.LabelHostname {
			t.Errorf("%s: anti-affinity %+v (%v), want one per kubernetes.io/hostname", ds.Name, term, err)
			continue
		}
		for _, other := range sets {
			if !sel.Matches(labels.Set(other.Spec.Template.Labels)) {
				t.Errorf("%s's pods may share a node with %s's", ds.Name, other.Name)
			}
		}
		for _, op := range operands {
			if op.name != gpuv1alpha1.OperandDriver && sel.Matches(labels.Set(BuildDaemonSet(op, cp, "loom-system").Spec.Template.Labels)) {
				t.Errorf("%s's pods keep off the %s", ds.Name, op.name)
			}
		}
	}
}

// GPU Operator's driver manager runs before the driver container, with
// what it needs: its node, Loom's namespace, the host's /run/nvidia, root
// and /sys, privileges, and its driver ServiceAccount's rights. Under
// autoUpgrade it neither evicts GPU pods nor drains (Loom's upgrade did,
// and its cordon must hold until the new driver is validated); without
// it, it evicts them and drains by the upgrade policy's drain. The
// policy's manager image and env are used, its env over Loom's, and none
// of it moves the driver's template hash.
func TestDriverManagerRunsBeforeTheDriver(t *testing.T) {
	manager := func(cp *gpuv1alpha1.ClusterPolicy) (corev1.PodSpec, corev1.Container, map[string]string) {
		spec := BuildDaemonSet(operandByName(gpuv1alpha1.OperandDriver), cp, "loom-system").Spec.Template.Spec
		if len(spec.InitContainers) == 0 || spec.InitContainers[0].Name != "k8s-driver-manager" {
			t.Fatalf("driver pod init containers %+v: want k8s-driver-manager first", spec.InitContainers)
		}
		c := spec.InitContainers[0]
		env := map[string]string{}
		for _, e := range c.Env {
			if _, twice := env[e.Name]; twice {
				t.Errorf("env %s twice", e.Name)
			}
			env[e.Name] = e.Value
			if e.ValueFrom != nil {
				env[e.Name] = e.ValueFrom.FieldRef.FieldPath
			}
		}
		return spec, c, env
	}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	hash := BuildDaemonSet(operandByName(gpuv1alpha1.OperandDriver), cp, "loom-system").Spec.Template.Annotations[gpuv1alpha1.AnnotationTemplateHash]
	spec, c, env := manager(cp)
	if c.Image != "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.0" || strings.Join(append(c.Command, c.Args...), " ") != "driver-manager uninstall_driver" ||
		c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Errorf("manager %s %v %v privileged %+v", c.Image, c.Command, c.Args, c.SecurityContext)
	}
	for k, v := range map[string]string{"NODE_NAME": "spec.nodeName", "OPERATOR_NAMESPACE": "metadata.namespace", "NVIDIA_VISIBLE_DEVICES": "void",
		"ENABLE_GPU_POD_EVICTION": "false", "ENABLE_AUTO_DRAIN": "false"} {
		if env[k] != v {
			t.Errorf("autoUpgrade: %s=%q, want %q", k, env[k], v)
		}
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
		if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }) {
			t.Errorf("mount %s of no volume %s", m.MountPath, m.Name)
		}
	}
	if mounts["/run/nvidia"] == "" || mounts["/host"] == "" || mounts["/sys"] == "" {
		t.Errorf("manager mounts %v: want /run/nvidia, /host and /sys", mounts)
	}
	rules := operandRules[gpuv1alpha1.OperandDriver].cluster
	for _, want := range [][2]string{{"nodes", "patch"}, {"pods", "list"}, {"pods", "delete"}, {"pods/eviction", "create"}} {
		if !slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.Resources, want[0]) && slices.Contains(r.Verbs, want[1])
		}) {
			t.Errorf("the driver's ServiceAccount may not %s %s", want[1], want[0])
		}
	}

	cp.Spec.Driver.UpgradePolicy = gpuv1alpha1.DriverUpgradePolicy{AutoUpgrade: ptr.To(false),
		Drain: &gpuv1alpha1.DrainSpec{Enable: true, Force: true, PodSelector: "app=training", TimeoutSeconds: 120, DeleteEmptyDir: true}}
	cp.Spec.Driver.Manager = gpuv1alpha1.DriverManagerSpec{Image: gpuv1alpha1.ImageSpec{Version: "v0.8.1", PullSecrets: []string{"regcred"}},
		Env: []corev1.EnvVar{{Name: "DRAIN_USE_FORCE", Value: "false"}, {Name: "ENABLE_GPU_POD_EVICTION", Value: "false"}}}
	spec, c, env = manager(cp)
	for k, v := range map[string]string{"ENABLE_GPU_POD_EVICTION": "false", "ENABLE_AUTO_DRAIN": "true", "DRAIN_USE_FORCE": "false",
		"DRAIN_POD_SELECTOR_LABEL": "app=training", "DRAIN_TIMEOUT_SECONDS": "120s", "DRAIN_DELETE_EMPTYDIR_DATA": "true"} {
		if env[k] != v {
			t.Errorf("autoUpgrade off, drain, env: %s=%q, want %q", k, env[k], v)
		}
	}
	if c.Image != "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.1" || !slices.Contains(spec.ImagePullSecrets, corev1.LocalObjectReference{Name: "regcred"}) {
		t.Errorf("manager image %s, pull secrets %v", c.Image, spec.ImagePullSecrets)
	}
	cp.Spec.Driver.Manager.Env = nil
	if _, _, env = manager(cp); env["ENABLE_GPU_POD_EVICTION"] != "true" {
		t.Errorf("autoUpgrade off: ENABLE_GPU_POD_EVICTION=%q, want true", env["ENABLE_GPU_POD_EVICTION"])
	}
	if got := BuildDaemonSet(operandByName(gpuv1alpha1.OperandDriver), cp, "loom-system").Spec.Template.Annotations[gpuv1alpha1.AnnotationTemplateHash]; got != hash {
		t.Errorf("the manager's settings moved the driver's template hash %s to %s: every driver would restart", hash, got)
	}
}
