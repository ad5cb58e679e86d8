package clusterpolicy

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/daemonplace"
)

// GPU nodes are often tainted for their teams (dedicated=ml:NoSchedule).
// A DaemonSet places no pod on a node whose taint it does not tolerate and
// leaves that node out of its counts: the policy must not read Ready while
// such a GPU node runs no driver and no device plugin. It names the node
// and the taint. Tolerated taints (nvidia.com/gpu, one the policy
// tolerates), cordons and NotReady nodes' taints name nothing.
func TestUntoleratedTaintsHoldTheComponent(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Generation: 1}}
	cp.Spec.DaemonSets.Tolerations = []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpEqual, Value: "infra", Effect: corev1.TaintEffectNoSchedule}}
	node := func(name string, taints ...corev1.Taint) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}},
			Spec:   corev1.NodeSpec{Taints: taints},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: "Ubuntu 22.04.4 LTS"}}}
	}
	noSchedule := func(k, v string) corev1.Taint {
		return corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffectNoSchedule}
	}
	nodes := []corev1.Node{
		node("gpu-a", noSchedule("nvidia.com/gpu", "present")),
		node("gpu-b", noSchedule("team", "infra"), corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}),
		node("gpu-c", noSchedule(corev1.TaintNodeNotReady, ""), corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}),
		node("gpu-d", noSchedule("dedicated", "ml")),
	}
	dpOnly := node("gpu-e", corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoExecute})
	dpOnly.Labels["nvidia.com/gpu.deploy.operands"] = "false"
	nodes = append(nodes, dpOnly)
	p := desired(cp, "loom-system", cluster{nodes: nodes})
	got := untoleratedTaints(cp, p.objects, labelled(nodes, p.targets))
	for _, op := range []string{"driver", "container-toolkit", "device-plugin"} {
		if len(got[op]) != 1 || got[op][0] != "gpu-d (dedicated=ml:NoSchedule)" {
			t.Errorf("%s: untolerated %v, want gpu-d alone", op, got[op])
		}
	}

	// The DaemonSets count only the nodes they place on: all ready there.
	st := status(cp, observed{active: "default", gpuNodes: 5, daemonSets: allRolledOut(3), cluster: cluster{nodes: nodes}, untolerated: got}, nil)
	c := meta.FindStatusCondition(st.Conditions, "Ready")
	if st.State != gpuv1alpha1.PolicyNotReady || c == nil || c.Reason != ReasonComponentsWait || !strings.Contains(c.Message, "gpu-d (dedicated=ml:NoSchedule)") {
		t.Errorf("a GPU node without the stack: state %s, Ready %+v", st.State, c)
	}
	// Tolerating it (or opting the node out) makes the stack Ready.
	cp.Spec.DaemonSets.Tolerations = append(cp.Spec.DaemonSets.Tolerations, corev1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpExists})
	p = desired(cp, "loom-system", cluster{nodes: nodes})
	if got := untoleratedTaints(cp, p.objects, nodes); len(got) != 0 {
		t.Errorf("tolerated: untolerated %v", got)
	}
}

// A taint coming or going changes what the status says: the Node watch
// passes it, and nothing else of the taints (an equal list read again).
func TestNodeWatchPassesTaintChanges(t *testing.T) {
	n := func(taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a"}, Spec: corev1.NodeSpec{Taints: taints}}
	}
	ml := corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule, TimeAdded: &metav1.Time{}}
	p := nodeInfoChanged()
	if !p.Update(event.UpdateEvent{ObjectOld: n(), ObjectNew: n(ml)}) {
		t.Error("a taint added is not passed")
	}
	again := ml
	again.TimeAdded = &metav1.Time{}
	if p.Update(event.UpdateEvent{ObjectOld: n(ml), ObjectNew: n(again)}) {
		t.Error("an unchanged taint list is passed")
	}
	// The toolkit follows the nodes' containerd.
	upgraded := n()
	upgraded.Status.NodeInfo.ContainerRuntimeVersion, upgraded.Status.NodeInfo.KubeletVersion = "containerd://1.7.17-k3s1", "v1.30.2+rke2r1"
	if !p.Update(event.UpdateEvent{ObjectOld: n(), ObjectNew: upgraded}) {
		t.Error("a container runtime change is not passed")
	}
}

// A node GPU Operator labelled nvidia.com/gpu.deploy.driver=pre-installed
// has a driver on its host: Loom's driver stays off it (a driver container
// there would fight the host's for the kernel modules), whatever its OS,
// while the rest of the stack runs there; =false does the same, and any
// other value keeps the driver.
func TestPreInstalledDriverKeepsTheDriverOff(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	for _, tt := range []struct {
		value, osImage string
		driver         bool
	}{
		{"pre-installed", "Ubuntu 22.04.4 LTS", false},
		{"pre-installed", "Debian GNU/Linux 12 (bookworm)", false},
		{"false", "Ubuntu 22.04.4 LTS", false},
		{"true", "Ubuntu 22.04.4 LTS", true},
		{"", "Ubuntu 22.04.4 LTS", true},
	} {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: tt.osImage}}}
		if tt.value != "" {
			n.Labels["nvidia.com/gpu.deploy.driver"] = tt.value
		}
		p := desired(cp, "loom-system", cluster{nodes: []corev1.Node{n}})
		n = labelled([]corev1.Node{n}, p.targets)[0]
		placed := map[string]bool{}
		for _, o := range p.objects {
			if ds, ok := o.(*appsv1.DaemonSet); ok && daemonplace.Places(&ds.Spec.Template.Spec, &n) {
				placed[ds.Labels[gpuv1alpha1.LabelComponent]] = true
			}
		}
		if placed["driver"] != tt.driver || !placed["device-plugin"] || len(p.noDriver) > 0 {
			t.Errorf("deploy.driver=%q on %s: driver placed %v (want %v), device plugin placed %v, no driver %v",
				tt.value, tt.osImage, placed["driver"], tt.driver, placed["device-plugin"], p.noDriver)
		}
		if meantFor(&n, cp, "driver") != tt.driver {
			t.Errorf("deploy.driver=%q: meant for the driver %v", tt.value, !tt.driver)
		}
	}
}

// GPU Operator's driver manager (the driver pod's init container) and MIG
// manager stop the operands on their node by setting
// nvidia.com/gpu.deploy.<operand> to a paused value, then wait for the
// operand's pods, by GPU Operator's app label, to be gone before they
// unload the driver or change the MIG mode: Loom's operands leave such a
// node (and are not awaited there by the status) and carry that label.
// The driver, which neither pauses, stays.
func TestPausedOperandsLeaveTheNode(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	cp.Spec.DCGM.Enabled, cp.Spec.NodeStatusExporter.Enabled = ptr.To(true), ptr.To(true)
	for _, value := range []string{"paused-for-driver-upgrade", "paused-for-mig-change"} {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: "Ubuntu 22.04.4 LTS"}}}
		for _, op := range operands {
			n.Labels["nvidia.com/gpu.deploy."+op.name] = value
		}
		p := desired(cp, "loom-system", cluster{nodes: []corev1.Node{n}})
		n = labelled([]corev1.Node{n}, p.targets)[0]
		for _, o := range p.objects {
			ds, ok := o.(*appsv1.DaemonSet)
			if !ok {
				continue
			}
			op := ds.Labels[gpuv1alpha1.LabelComponent]
			driver := op == gpuv1alpha1.OperandDriver
			if daemonplace.Places(&ds.Spec.Template.Spec, &n) != driver || meantFor(&n, cp, op) != driver {
				t.Errorf("%s=%s: %s placed %v, meant for it %v", "nvidia.com/gpu.deploy."+op, value, ds.Name,
					daemonplace.Places(&ds.Spec.Template.Spec, &n), meantFor(&n, cp, op))
			}
			if app := ds.Spec.Template.Labels["app"]; !driver && !strings.HasPrefix(app, "nvidia-") {
				t.Errorf("%s's pods labelled app=%q: the managers wait for GPU Operator's app label", ds.Name, app)
			}
		}
	}
	if got := BuildDaemonSet(operandByName(gpuv1alpha1.OperandDevicePlugin), cp, "ns").Spec.Template.Labels["app"]; got != "nvidia-device-plugin-daemonset" {
		t.Errorf("device plugin pods app=%q", got)
	}
}
