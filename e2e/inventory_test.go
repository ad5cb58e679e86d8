package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

const loomNS = "loom-system"

// startLoom installs the chart (idempotently) and runs a manager under its
// service account until the test ends.
func startLoom(t *testing.T) *framework.Release {
	t.Helper()
	rel, _ := startLoomManager(t)
	return rel
}

// startLoomManager is startLoom that also returns the manager process.
func startLoomManager(t *testing.T, args ...string) (*framework.Release, *framework.Manager) {
	t.Helper()
	ctx := context.Background()
	rel, err := cluster.InstallChart(ctx, "loom", loomNS)
	if err != nil {
		t.Fatal(err)
	}
	m, err := cluster.RunManager(ctx, loomBin, rel, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop(20 * time.Second) })
	if err := cluster.WaitReady(ctx, m, loomNS, "loom-manager", 90*time.Second); err != nil {
		t.Fatal(err)
	}
	return rel, m
}

func runAgent(t *testing.T, rel *framework.Release, spec framework.AgentSpec) *framework.Process {
	t.Helper()
	p, err := cluster.RunAgent(context.Background(), loomBin, rel, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	return p
}

func gpuNode(name string) (*gpuv1alpha1.GPUNode, error) {
	gn := &gpuv1alpha1.GPUNode{}
	return gn, cluster.Client.Get(context.Background(), client.ObjectKey{Name: name}, gn)
}

func nodeLabels(name string) (map[string]string, error) {
	n := &corev1.Node{}
	err := cluster.Client.Get(context.Background(), client.ObjectKey{Name: name}, n)
	return n.Labels, err
}

func wantLabels(name string, want map[string]string) func() (bool, string) {
	return func() (bool, string) {
		l, err := nodeLabels(name)
		if err != nil {
			return false, err.Error()
		}
		for k, v := range want {
			if l[k] != v {
				return false, fmt.Sprintf("node %s: %s = %q, want %q", name, k, l[k], v)
			}
		}
		return true, ""
	}
}

// A DGX H100 node, a DGX A100 node with MIG and a CPU node: two GPUNodes
// with the right inventory, GFD labels on the GPU nodes only, hand-set
// labels untouched, a restart that writes nothing, GPUs that go away taking
// their labels, a cross-node write refused, and GPUNodes collected with
// their Node.
func TestInventoryOnASimulatedFleet(t *testing.T) {
	ctx := context.Background()
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "inv-h100", Count: 1, GPUs: 8, Product: "NVIDIA-H100-80GB-HBM3",
		Labels: map[string]string{"team": "ml", "nvidia.com/gpu.deploy.dcgm": "false"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "inv-a100", Count: 1, GPUs: 8, Product: "NVIDIA-A100-SXM4-40GB"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "inv-cpu", Count: 1}); err != nil {
		t.Fatal(err)
	}
	rel := startLoom(t)
	h100 := runAgent(t, rel, framework.AgentSpec{Node: "inv-h100-0", System: "dgx-h100"})
	a100 := runAgent(t, rel, framework.AgentSpec{Node: "inv-a100-0", System: "dgx-a100", MIG: "3g.20gb:1,2g.10gb:1,1g.5gb:2"})

	eventually(t, 60*time.Second, func() (bool, string) {
		for _, n := range []string{"inv-h100-0", "inv-a100-0"} {
			gn, err := gpuNode(n)
			if err != nil || !meta.IsStatusConditionTrue(gn.Status.Conditions, gpuv1alpha1.ConditionReady) {
				return false, fmt.Sprintf("GPUNode %s not Ready: %v %+v", n, err, gn.Status.Conditions)
			}
		}
		return true, ""
	})
	h, _ := gpuNode("inv-h100-0")
	if h.Status.GPUCount != 8 || h.Status.Product != "NVIDIA H100 80GB HBM3" || h.Status.GPUs[0].MemoryMiB != 81920 ||
		h.Status.MIG != "Disabled" || h.Status.Simulated != "dgx-h100" {
		t.Errorf("H100 GPUNode status %+v", h.Status)
	}
	a, _ := gpuNode("inv-a100-0")
	if a.Status.GPUCount != 8 || a.Status.Product != "NVIDIA A100-SXM4-40GB" || a.Status.MIG != "Enabled" ||
		len(a.Status.GPUs[7].MIG.Devices) != 4 || a.Status.GPUs[7].MIG.Devices[0].Profile != "3g.20gb" {
		t.Errorf("A100 GPUNode status %+v", a.Status)
	}
	if _, err := gpuNode("inv-cpu-0"); !apierrors.IsNotFound(err) {
		t.Errorf("CPU node has a GPUNode (err %v)", err)
	}

	eventually(t, 30*time.Second, wantLabels("inv-h100-0", map[string]string{
		"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
		"nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.family": "hopper", "nvidia.com/mig.strategy": "none",
		"nvidia.com/cuda.driver-version.full": "550.54.15", "team": "ml", "nvidia.com/gpu.deploy.dcgm": "false",
	}))
	eventually(t, 30*time.Second, wantLabels("inv-a100-0", map[string]string{
		"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed",
		"nvidia.com/mig-3g.20gb.count": "8", "nvidia.com/mig-1g.5gb.count": "16", "nvidia.com/mig-2g.10gb.memory": "9856",
	}))
	if l, _ := nodeLabels("inv-cpu-0"); hasPrefix(l, "nvidia.com/") {
		t.Errorf("CPU node got GPU labels: %v", l)
	}
	gnList := &gpuv1alpha1.GPUNodeList{}
	if err := cluster.Client.List(ctx, gnList); err != nil {
		t.Fatal(err)
	}
	var ours []string
	for _, gn := range gnList.Items {
		if strings.HasPrefix(gn.Name, "inv-") {
			ours = append(ours, gn.Name)
		}
	}
	if len(ours) != 2 {
		t.Errorf("GPUNodes of this fleet: %v, want the H100 and A100 nodes only", ours)
	}

	// An agent restart with unchanged GPUs writes nothing.
	h, _ = gpuNode("inv-h100-0")
	rv := h.ResourceVersion
	h100.Stop(10 * time.Second)
	h100 = runAgent(t, rel, framework.AgentSpec{Node: "inv-h100-0", System: "dgx-h100"})
	time.Sleep(3 * time.Second)
	if exited, err := h100.Exited(); exited {
		t.Fatalf("restarted agent exited: %v\n%s", err, h100.Tail(2000))
	}
	if h, _ = gpuNode("inv-h100-0"); h.ResourceVersion != rv {
		t.Errorf("GPUNode written on an agent restart with unchanged GPUs (rv %s -> %s)", rv, h.ResourceVersion)
	}
	if strings.Contains(h100.Tail(1<<20), "published GPU inventory") {
		t.Errorf("restarted agent published:\n%s", h100.Tail(2000))
	}

	// The agent on the H100 node cannot write the A100 node's GPUNode.
	rogue := runAgent(t, rel, framework.AgentSpec{Node: "inv-h100-0", NodeName: "inv-a100-0", System: "dgx-b200"})
	eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(rogue.Tail(1<<16), "may write only GPUNode inv-h100-0, not inv-a100-0"), "no denial in the rogue agent's log"
	})
	if a2, _ := gpuNode("inv-a100-0"); a2.Status.Product != "NVIDIA A100-SXM4-40GB" {
		t.Errorf("rogue agent changed the A100 GPUNode: %+v", a2.Status)
	}
	rogue.Stop(10 * time.Second)

	// The A100's GPUs go away (from NVML and the PCI bus): its GFD labels
	// go, and nothing else; gpu.present stays while NFD's PCI label says
	// an NVIDIA device is there.
	a100.Stop(10 * time.Second)
	zero := 0
	runAgent(t, rel, framework.AgentSpec{Node: "inv-a100-0", System: "dgx-a100", GPUs: &zero})
	eventually(t, 30*time.Second, func() (bool, string) {
		l, err := nodeLabels("inv-a100-0")
		if err != nil {
			return false, err.Error()
		}
		for k := range l {
			if strings.HasPrefix(k, "nvidia.com/") && k != gpuv1alpha1.LabelPresent {
				return false, fmt.Sprintf("GPU labels left: %v", l)
			}
		}
		return l["feature.node.kubernetes.io/pci-10de.present"] == "true" && l[gpuv1alpha1.LabelPresent] == "true", fmt.Sprintf("labels %v", l)
	})

	// Deleting a Node garbage-collects its GPUNode.
	n := &corev1.Node{}
	n.Name = "inv-h100-0"
	h100.Stop(10 * time.Second)
	if err := cluster.Client.Delete(ctx, n); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		_, err := gpuNode("inv-h100-0")
		return apierrors.IsNotFound(err), fmt.Sprintf("GPUNode of a deleted node still there (%v)", err)
	})
}

func hasPrefix(m map[string]string, prefix string) bool {
	for k := range m {
		if strings.HasPrefix(k, prefix) && k != "nvidia.com/gpu.deploy.dcgm" {
			return true
		}
	}
	return false
}
