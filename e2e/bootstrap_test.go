package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

// A node as it comes from the data centre: eight H100s on its PCI bus (and
// NFD's label for them), no driver, no device plugin, so no GPU resource.
// The node agent sees the GPUs on the PCI bus without NVML; Loom labels the
// node present; the driver, the toolkit, the validator and the device
// plugin come up in that order (NodeSim plays each container, honouring the
// init containers Loom rendered), and only then does the node advertise
// nvidia.com/gpu. An agent restarted while NVML fails changes no label and
// removes no operand pod.
func TestBareNodeBootstrap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const node = "bare-0"
	testNode(t, node, framework.NodeSpec{GPUs: 8, Bare: true})
	rel, _ := startLoomManager(t)
	sim := cluster.StartNodeSim(ctx, loomNS)
	spec, err := sim.Add(framework.AgentSpec{Node: node, System: "dgx-h100"})
	if err != nil {
		t.Fatal(err)
	}
	agent := runAgent(t, rel, spec)

	// Before any policy: PCI presence, NVML unavailable, no GPU resource.
	eventually(t, 60*time.Second, func() (bool, string) {
		gn, err := gpuNode(node)
		if err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(gn.Status.Conditions, gpuv1alpha1.ConditionNVMLUnavailable)
		l, _ := nodeLabels(node)
		return len(gn.Status.PCIDevices) == 8 && c != nil && c.Status == metav1.ConditionTrue && l[gpuv1alpha1.LabelPresent] == "true",
			fmt.Sprintf("%d PCI devices, NVMLUnavailable %+v, present=%q", len(gn.Status.PCIDevices), c, l[gpuv1alpha1.LabelPresent])
	})
	if n := allocatableGPUs(t, node); n != 0 {
		t.Fatalf("a bare node advertises %d nvidia.com/gpu", n)
	}

	createPolicy(t, &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap"}})
	eventually(t, 3*time.Minute, func() (bool, string) {
		return allocatableGPUs(t, node) == 8, fmt.Sprintf("allocatable nvidia.com/gpu %d; node log %v", allocatableGPUs(t, node), sim.Events(node))
	})
	order := []string{"driver loaded", "marker driver-ready", "marker toolkit-ready", "device plugin advertises"}
	assertInOrder(t, sim.Events(node), order)
	gn, err := gpuNode(node)
	if err != nil {
		t.Fatal(err)
	}
	if len(gn.Status.GPUs) != 8 || gn.Status.DriverVersion == "" {
		t.Fatalf("after the driver: %d GPUs from NVML, driver %q", len(gn.Status.GPUs), gn.Status.DriverVersion)
	}
	// NVML's inventory came after the driver loaded and before the device
	// plugin advertised (the plugin enumerates through NVML).
	labels, _ := nodeLabels(node)
	if labels[gpuv1alpha1.LabelProduct] == "" || labels[gpuv1alpha1.LabelCount] != "8" {
		t.Errorf("GFD labels after NVML: %v", labels)
	}

	// The agent restarts while NVML fails (driver broken): labels and
	// operand pods stay exactly as they were, once the whole stack runs
	// (the MIG manager comes last: it waits for GFD's mig.capable label).
	eventually(t, 2*time.Minute, func() (bool, string) {
		cp := &gpuv1alpha1.ClusterPolicy{}
		if err := cluster.Client.Get(ctx, client.ObjectKey{Name: "bootstrap"}, cp); err != nil {
			return false, err.Error()
		}
		return cp.Status.State == gpuv1alpha1.PolicyReady, fmt.Sprintf("policy %s: %+v", cp.Status.State, cp.Status.Conditions)
	})
	labels, _ = nodeLabels(node)
	before := operandPods(t, node)
	agent.Stop(10 * time.Second)
	sim.BreakDriver(node, true)
	runAgent(t, rel, spec)
	eventually(t, 60*time.Second, func() (bool, string) {
		gn, err := gpuNode(node)
		if err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(gn.Status.Conditions, gpuv1alpha1.ConditionNVMLUnavailable)
		return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprintf("NVMLUnavailable %+v", c)
	})
	time.Sleep(5 * time.Second) // let anything that would react do so
	after, _ := nodeLabels(node)
	for k, v := range labels {
		if strings.HasPrefix(k, gpuv1alpha1.LabelPrefix) && after[k] != v {
			t.Errorf("label %s changed from %q to %q while NVML failed", k, v, after[k])
		}
	}
	if got := operandPods(t, node); !sameUIDs(before, got) {
		t.Errorf("operand pods changed while NVML failed: %v -> %v", before, got)
	}
	gn, _ = gpuNode(node)
	if len(gn.Status.GPUs) != 8 {
		t.Errorf("the GPUNode lost its GPUs while NVML failed: %d", len(gn.Status.GPUs))
	}
	sim.BreakDriver(node, false)
}

// assertInOrder checks that each of want appears in events (by prefix),
// in that order.
func assertInOrder(t *testing.T, events []framework.SimEvent, want []string) {
	t.Helper()
	at := map[string]time.Time{}
	idx := map[string]int{}
	for i, e := range events {
		for _, w := range want {
			if _, seen := idx[w]; !seen && strings.HasPrefix(e.What, w) {
				idx[w], at[w] = i, e.At
			}
		}
	}
	for i, w := range want {
		if _, ok := idx[w]; !ok {
			t.Fatalf("node never went through %q: %v", w, events)
		}
		if i > 0 && idx[w] < idx[want[i-1]] {
			t.Errorf("%q came before %q: %v", w, want[i-1], events)
		}
	}
	t.Logf("bring-up: %s", describeOrder(want, at))
}

func describeOrder(want []string, at map[string]time.Time) string {
	parts := make([]string, len(want))
	for i, w := range want {
		parts[i] = fmt.Sprintf("%s +%s", w, at[w].Sub(at[want[0]]).Round(10*time.Millisecond))
	}
	return strings.Join(parts, ", ")
}

func allocatableGPUs(t *testing.T, name string) int64 {
	t.Helper()
	n := &corev1.Node{}
	if err := cluster.Client.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	q := n.Status.Allocatable[framework.GPUResource]
	return q.Value()
}

// operandPods are the GPU stack's pods on a node, by name → UID.
func operandPods(t *testing.T, node string) map[string]types.UID {
	t.Helper()
	pods := &corev1.PodList{}
	if err := cluster.Client.List(context.Background(), pods, client.InNamespace(loomNS), client.HasLabels{gpuv1alpha1.LabelComponent}); err != nil {
		t.Fatal(err)
	}
	out := map[string]types.UID{}
	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil && p.Labels[gpuv1alpha1.LabelComponent] != "node-agent" {
			out[p.Name] = p.UID
		}
	}
	return out
}

func sameUIDs(a, b map[string]types.UID) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A simulated A100 40GB node labelled nvidia.com/mig.config=all-1g.5gb
// ends with seven 1g.5gb devices per GPU and mig.config.state=success; a
// layout the config lacks, or one for another GPU (all-1g.18gb is the
// H200's), ends failed.
func TestMIGLayoutTakesEffect(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const node = "mig-a100"
	testNode(t, node, framework.NodeSpec{GPUs: 8, Bare: true})
	rel, _ := startLoomManager(t)
	sim := cluster.StartNodeSim(ctx, loomNS)
	spec, err := sim.Add(framework.AgentSpec{Node: node, System: "dgx-a100"})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, rel, spec)
	createPolicy(t, &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "mig"},
		Spec: gpuv1alpha1.ClusterPolicySpec{MIG: gpuv1alpha1.MIGSpec{Strategy: gpuv1alpha1.MIGStrategyMixed}}})
	eventually(t, 3*time.Minute, func() (bool, string) {
		return allocatableGPUs(t, node) == 8, fmt.Sprintf("allocatable %d; %v", allocatableGPUs(t, node), sim.Events(node))
	})
	for _, tc := range []struct{ layout, state string }{
		{"all-1g.18gb", "failed"}, {"no-such-layout", "failed"}, {"all-1g.5gb", "success"},
	} {
		labelNode(t, node, gpuv1alpha1.LabelMIGConfig, tc.layout)
		eventually(t, 90*time.Second, func() (bool, string) {
			l, _ := nodeLabels(node)
			return l[gpuv1alpha1.LabelMIGConfigState] == tc.state, fmt.Sprintf("%s: state %q; %v", tc.layout, l[gpuv1alpha1.LabelMIGConfigState], sim.Events(node))
		})
		// The policy counts the node by its MIG manager's state.
		eventually(t, 30*time.Second, func() (bool, string) {
			cp := &gpuv1alpha1.ClusterPolicy{}
			if err := cluster.Client.Get(ctx, client.ObjectKey{Name: "mig"}, cp); err != nil || cp.Status.MIG == nil {
				return false, fmt.Sprintf("policy: %v", err)
			}
			m := cp.Status.MIG
			ok := (tc.state == "failed" && m.ConfigFailed == 1) || (tc.state == "success" && m.ConfigSuccess == 1 && m.ConfigFailed == 0)
			return ok, fmt.Sprintf("%s: status.mig %+v", tc.layout, *m)
		})
	}
	gn, err := gpuNode(node)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gn.Status.GPUs {
		if g.MIG == nil || len(g.MIG.Devices) != 7 || g.MIG.Devices[0].Profile != "1g.5gb" {
			t.Fatalf("GPU %d after all-1g.5gb: %+v", g.Index, g.MIG)
		}
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		q := resourceOf(t, node, "nvidia.com/mig-1g.5gb")
		return q == 56, fmt.Sprintf("nvidia.com/mig-1g.5gb allocatable %d", q)
	})
}

func labelNode(t *testing.T, name, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cluster.Client.Patch(context.Background(), n, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

func resourceOf(t *testing.T, name, res string) int64 {
	t.Helper()
	n := &corev1.Node{}
	if err := cluster.Client.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	q := n.Status.Allocatable[corev1.ResourceName(res)]
	return q.Value()
}

// A named time-slicing config (replicas 4) takes effect: the device plugin
// advertises 32 nvidia.com/gpu on an 8-GPU node and GFD's labels say so;
// editing the ConfigMap's content (replicas 2) rolls the device plugin and
// both follow. The fleet's second OS gets its own driver DaemonSet, with
// the OS in the image tag; "latest" is refused at apply.
func TestSharingConfigTakesEffect(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const node, rhel = "share-0", "share-rhel"
	testNode(t, node, framework.NodeSpec{GPUs: 8, Bare: true})
	testNode(t, rhel, framework.NodeSpec{GPUs: 8, OSImage: "Red Hat Enterprise Linux 9.4 (Plow)"})
	rel, _ := startLoomManager(t)
	sim := cluster.StartNodeSim(ctx, loomNS)
	spec, err := sim.Add(framework.AgentSpec{Node: node, System: "dgx-h100"})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, rel, spec)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpu-sharing", Namespace: loomNS},
		Data: map[string]string{"ts": timeSlicing(4)}}
	if err := cluster.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Client.Delete(context.Background(), cm) })
	bad := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "latest"}}
	bad.Spec.Driver.Image.Version = "latest"
	if err := cluster.Client.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "driver.image.version") {
		t.Errorf("version latest: %v", err)
	}
	createPolicy(t, &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "sharing"},
		Spec: gpuv1alpha1.ClusterPolicySpec{DevicePlugin: gpuv1alpha1.DevicePluginSpec{
			Config: &gpuv1alpha1.DevicePluginConfig{ConfigMapName: "gpu-sharing", DefaultConfig: "ts"}}}})
	shared := func(gpus int64, replicas string) {
		eventually(t, 2*time.Minute, func() (bool, string) {
			l, _ := nodeLabels(node)
			return allocatableGPUs(t, node) == gpus && l[gpuv1alpha1.LabelReplicas] == replicas && strings.HasSuffix(l[gpuv1alpha1.LabelProduct], "-SHARED"),
				fmt.Sprintf("allocatable %d (want %d), replicas %q (want %s), product %q", allocatableGPUs(t, node), gpus, l[gpuv1alpha1.LabelReplicas], replicas, l[gpuv1alpha1.LabelProduct])
		})
	}
	shared(32, "4")
	before := templateHash(t, "loom-device-plugin")
	cm.Data["ts"] = timeSlicing(2)
	if err := cluster.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	shared(16, "2")
	// The simulated device plugin reads the ConfigMap itself: the
	// template's roll is awaited apart.
	eventually(t, time.Minute, func() (bool, string) {
		after := templateHash(t, "loom-device-plugin")
		return after != before, fmt.Sprintf("the device plugin's template did not change with its config (%s)", after)
	})
	images := map[string]string{}
	for _, name := range []string{"loom-driver-ubuntu22.04", "loom-driver-rhel9.4"} {
		ds := &appsv1.DaemonSet{}
		if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: loomNS, Name: name}, ds); err != nil {
			t.Fatalf("driver DaemonSet %s: %v", name, err)
		}
		images[name] = ds.Spec.Template.Spec.Containers[0].Image
	}
	if !strings.HasSuffix(images["loom-driver-ubuntu22.04"], "-ubuntu22.04") || !strings.HasSuffix(images["loom-driver-rhel9.4"], "-rhel9.4") {
		t.Errorf("driver images %v", images)
	}
}

func timeSlicing(replicas int) string {
	return fmt.Sprintf("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: %d\n", replicas)
}

// templateHash is the config hash on a DaemonSet's pod template.
func templateHash(t *testing.T, name string) string {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	if err := cluster.Client.Get(context.Background(), client.ObjectKey{Namespace: loomNS, Name: name}, ds); err != nil {
		t.Fatal(err)
	}
	return ds.Spec.Template.Annotations[gpuv1alpha1.AnnotationConfigHash]
}
