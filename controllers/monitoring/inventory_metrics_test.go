package monitoring

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/testenv"
)

// The inventory metrics count a GPUNode only while its Node exists, as the
// index does: one left behind by a deleted node (its agent wrote it after
// the garbage collector took the old one) would otherwise report GPUs
// that dcgm-exporter never shows (LoomGPUMissing) and an agent that never
// reports (LoomGPUNodeAgentNotReporting), for a node that is gone.
// A node in a driver upgrade (cordoned for it) says so, for the alerts
// that hold their tongue meanwhile, and so does each operand whose pod on
// a node is not ready (a driver building its module): pods of Loom's, not
// being deleted, on a node that exists. So does a node that is not Ready
// (down, its kubelet silent), whose pods all stop reporting, one cordoned
// (for maintenance), and one whose agent runs unprivileged. The states a
// node is seldom in (an upgrade, a cordon, an operand not ready, an agent
// unprivileged) have a series only while the node is in them: the fleet's
// steady state holds none of them.
func TestInventoryMetricsCountOnlyGPUNodesWithANode(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := gpuv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ready := []metav1.Condition{{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Collected"}}
	gpuNode := func(name string) *gpuv1alpha1.GPUNode {
		return &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: gpuv1alpha1.GPUNodeStatus{GPUCount: 8, Product: "NVIDIA-H100-80GB-HBM3", Conditions: ready}}
	}
	nodeReady := func(s corev1.ConditionStatus) corev1.NodeStatus {
		return corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}, {Type: corev1.NodeReady, Status: s}}}
	}
	// The agent collected and found a GPU unhealthy: Ready False, but
	// reporting; gpu-e's agent fails to collect.
	unhealthyNode := gpuNode("gpu-d")
	unhealthyNode.Status.GPUs = []gpuv1alpha1.GPU{{Index: 0, Health: gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy}}}
	unhealthyNode.Status.Conditions = []metav1.Condition{{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: gpuv1alpha1.ReasonUnhealthyGPUs}}
	failedNode := gpuNode("gpu-e")
	failedNode.Status.Conditions = []metav1.Condition{{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: gpuv1alpha1.ReasonCollectionFailed}}
	// gpu-f's agent runs unprivileged: not reporting its GPUs, by
	// configuration.
	unprivilegedNode := gpuNode("gpu-f")
	unprivilegedNode.Status.Conditions = []metav1.Condition{{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: gpuv1alpha1.ReasonUnprivileged}}
	pod := func(name, node, component string, ready corev1.ConditionStatus) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "loom-system",
			Labels: map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: component}},
			Spec:   corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}}}
	}
	deleted := pod("driver-old", "gpu-b", "driver", corev1.ConditionTrue)
	deleted.DeletionTimestamp, deleted.Finalizers = &metav1.Time{Time: time.Unix(1, 0)}, []string{"x"}
	foreign := pod("other-driver", "gpu-a", "driver", corev1.ConditionFalse)
	foreign.Namespace = "gpu-operator"
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		pod("driver-a", "gpu-a", "driver", corev1.ConditionTrue), pod("toolkit-a", "gpu-a", "container-toolkit", corev1.ConditionFalse),
		pod("driver-b", "gpu-b", "driver", corev1.ConditionFalse), deleted, pod("driver-gone", "gone", "driver", corev1.ConditionTrue),
		pod("driver-c-new", "gpu-c", "driver", corev1.ConditionFalse), pod("driver-c", "gpu-c", "driver", corev1.ConditionTrue), foreign,
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a"}, Status: nodeReady(corev1.ConditionTrue)}, gpuNode("gpu-a"), gpuNode("gone"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-b", Labels: map[string]string{gpuv1alpha1.LabelUpgradeState: gpuv1alpha1.PodRestartRequired}},
			Status: nodeReady(corev1.ConditionTrue)}, gpuNode("gpu-b"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-c", Labels: map[string]string{gpuv1alpha1.LabelUpgradeState: gpuv1alpha1.UpgradeDone}},
			Status: nodeReady(corev1.ConditionUnknown)}, gpuNode("gpu-c"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-d"}, Spec: corev1.NodeSpec{Unschedulable: true}, Status: nodeReady(corev1.ConditionTrue)}, unhealthyNode,
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-e"}, Status: nodeReady(corev1.ConditionTrue)}, failedNode,
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-f"}, Status: nodeReady(corev1.ConditionTrue)}, unprivilegedNode,
	).Build()
	col := &inventoryCollector{}
	col.cache.Store(&inventorySource{Reader: testenv.NoCopyLists{Reader: c, T: t}, namespace: "loom-system"})
	want := `
# HELP loom_gpunode_agent_unprivileged 1 while the node agent runs unprivileged and cannot read the GPUs through NVML (GPUNode reason Unprivileged); absent otherwise.
# TYPE loom_gpunode_agent_unprivileged gauge
loom_gpunode_agent_unprivileged{node="gpu-f"} 1
# HELP loom_gpunode_driver_upgrade 1 while the node is in a driver upgrade (cordoned for it: from wait-for-jobs-required to uncordon-required); absent otherwise.
# TYPE loom_gpunode_driver_upgrade gauge
loom_gpunode_driver_upgrade{node="gpu-b"} 1
# HELP loom_gpunode_gpus GPUs the node agent found through NVML.
# TYPE loom_gpunode_gpus gauge
loom_gpunode_gpus{node="gpu-a",product="NVIDIA-H100-80GB-HBM3"} 8
loom_gpunode_gpus{node="gpu-b",product="NVIDIA-H100-80GB-HBM3"} 8
loom_gpunode_gpus{node="gpu-c",product="NVIDIA-H100-80GB-HBM3"} 8
loom_gpunode_gpus{node="gpu-d",product="NVIDIA-H100-80GB-HBM3"} 8
loom_gpunode_gpus{node="gpu-e",product="NVIDIA-H100-80GB-HBM3"} 8
loom_gpunode_gpus{node="gpu-f",product="NVIDIA-H100-80GB-HBM3"} 8
# HELP loom_gpunode_node_ready 1 when the node's Ready condition is True, else 0 (NotReady, Unknown: its kubelet silent).
# TYPE loom_gpunode_node_ready gauge
loom_gpunode_node_ready{node="gpu-a"} 1
loom_gpunode_node_ready{node="gpu-b"} 1
loom_gpunode_node_ready{node="gpu-c"} 0
loom_gpunode_node_ready{node="gpu-d"} 1
loom_gpunode_node_ready{node="gpu-e"} 1
loom_gpunode_node_ready{node="gpu-f"} 1
# HELP loom_gpunode_operand_not_ready 1 when the operand (component) has pods on the node and none is Ready; absent otherwise (all ready, or no pod there).
# TYPE loom_gpunode_operand_not_ready gauge
loom_gpunode_operand_not_ready{component="container-toolkit",node="gpu-a"} 1
loom_gpunode_operand_not_ready{component="driver",node="gpu-b"} 1
# HELP loom_gpunode_ready 1 when the node agent's last inventory collection succeeded, else 0.
# TYPE loom_gpunode_ready gauge
loom_gpunode_ready{node="gpu-a"} 1
loom_gpunode_ready{node="gpu-b"} 1
loom_gpunode_ready{node="gpu-c"} 1
loom_gpunode_ready{node="gpu-d"} 1
loom_gpunode_ready{node="gpu-e"} 0
loom_gpunode_ready{node="gpu-f"} 0
# HELP loom_gpunode_unschedulable 1 while the node is cordoned (spec.unschedulable: for maintenance, or by the driver upgrade); absent otherwise.
# TYPE loom_gpunode_unschedulable gauge
loom_gpunode_unschedulable{node="gpu-d"} 1
# HELP loom_gpunode_unhealthy_gpus GPUs the node agent marks Unhealthy (0 when all are healthy).
# TYPE loom_gpunode_unhealthy_gpus gauge
loom_gpunode_unhealthy_gpus{node="gpu-a"} 0
loom_gpunode_unhealthy_gpus{node="gpu-b"} 0
loom_gpunode_unhealthy_gpus{node="gpu-c"} 0
loom_gpunode_unhealthy_gpus{node="gpu-d"} 1
loom_gpunode_unhealthy_gpus{node="gpu-e"} 0
loom_gpunode_unhealthy_gpus{node="gpu-f"} 0
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
