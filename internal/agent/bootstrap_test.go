package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/inventory"
)

func isReady(gn *gpuv1alpha1.GPUNode) bool {
	return meta.IsStatusConditionTrue(gn.Status.Conditions, gpuv1alpha1.ConditionReady)
}

func nvmlUnavailable(reason string) func(*gpuv1alpha1.GPUNode) bool {
	return func(gn *gpuv1alpha1.GPUNode) bool {
		c := meta.FindStatusCondition(gn.Status.Conditions, gpuv1alpha1.ConditionNVMLUnavailable)
		return c != nil && c.Status == "True" && c.Reason == reason
	}
}

// An agent restarted while NVML cannot be initialised (after a reboot,
// before the driver is back) keeps the previous inventory and presence.
func TestAgentKeepsInventoryWhenNVMLUnavailableAtStart(t *testing.T) {
	const node = "agent-restart-no-nvml"
	sysfs := pciTree(t, 8)
	r := startAgent(t, &Agent{NodeName: node, Lib: sim(t, collect.SimOptions{System: "dgx-h100", Seed: node}), SysfsRoot: sysfs})
	before := waitFor(t, node, "Ready with 8 GPUs", func(gn *gpuv1alpha1.GPUNode) bool { return isReady(gn) && gn.Status.GPUCount == 8 })
	r.stop()

	lib := dgxh100.New()
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	startAgent(t, &Agent{NodeName: node, Lib: lib, SysfsRoot: sysfs})
	gn := waitFor(t, node, "NVMLUnavailable", nvmlUnavailable(gpuv1alpha1.ReasonNVMLInitFailed))
	if isReady(gn) || gn.Status.GPUCount != 8 || len(gn.Status.GPUs) != 8 || gn.Status.GPUs[7].UUID != before.Status.GPUs[7].UUID ||
		gn.Status.DriverVersion != before.Status.DriverVersion || len(gn.Status.PCIDevices) != 8 {
		t.Errorf("after a restart without NVML: %+v", gn.Status)
	}
}

// A bare node: PCI GPUs and no driver, then the driver appears, then it is
// unloaded (an upgrade) while the agent runs, then it is back.
func TestAgentBareNodeAndDriverUnloadedMidRun(t *testing.T) {
	const node = "agent-bare"
	root := t.TempDir()
	s := sim(t, collect.SimOptions{System: "dgx-a100", Seed: node, Bare: true, DriverRoot: root})
	sysfs := t.TempDir()
	if err := inventory.WritePCITree(sysfs, s.PCIDevices()); err != nil {
		t.Fatal(err)
	}
	r := startAgent(t, &Agent{NodeName: node, Lib: s, SysfsRoot: sysfs})
	gn := waitFor(t, node, "NVML library not found", nvmlUnavailable(gpuv1alpha1.ReasonNVMLInitFailed))
	if c := meta.FindStatusCondition(gn.Status.Conditions, gpuv1alpha1.ConditionNVMLUnavailable); c.Message != nvml.ErrorString(nvml.ERROR_LIBRARY_NOT_FOUND) ||
		len(gn.Status.PCIDevices) != 8 || gn.Status.PCIDevices[0].DeviceID != "0x20b0" || gn.Status.PCIDevices[0].Product != "NVIDIA A100-SXM4-40GB" {
		t.Errorf("bare node status %+v", gn.Status)
	}

	lib := collect.BareLibrary(root)
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, node, "Ready once the driver is there", func(gn *gpuv1alpha1.GPUNode) bool { return isReady(gn) && gn.Status.GPUCount == 8 })

	if err := os.Remove(lib); err != nil {
		t.Fatal(err)
	}
	r.agent.collectNow()
	gn = waitFor(t, node, "NVML lost", nvmlUnavailable(gpuv1alpha1.ReasonNVMLLost))
	if isReady(gn) || gn.Status.GPUCount != 8 || len(gn.Status.PCIDevices) != 8 {
		t.Errorf("driver unloaded: %+v", gn.Status)
	}
	// Retried with backoff: still unavailable, still 8 GPUs.
	gn = waitFor(t, node, "init retried", nvmlUnavailable(gpuv1alpha1.ReasonNVMLInitFailed))
	if gn.Status.GPUCount != 8 {
		t.Errorf("retrying NVML lost the GPUs: %+v", gn.Status)
	}
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, node, "Ready again", func(gn *gpuv1alpha1.GPUNode) bool { return isReady(gn) && gn.Status.GPUCount == 8 })
}

// A node with no GPUs on PCI or through NVML gets no GPUNode.
func TestAgentCreatesNoGPUNodeForACPUNode(t *testing.T) {
	const node = "agent-cpu"
	r := startAgent(t, &Agent{NodeName: node, Lib: sim(t, collect.SimOptions{System: "dgx-h100", GPUs: new(int)}),
		SysfsRoot: t.TempDir() + "/no-such-sysfs", Interval: 200 * time.Millisecond})
	time.Sleep(time.Second)
	err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, &gpuv1alpha1.GPUNode{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("GPUNode of a CPU node: %v", err)
	}
	r.stop()
	// Nor does a bare CPU node (PCI without NVIDIA devices, no driver).
	lib := dgxh100.New()
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	startAgent(t, &Agent{NodeName: node, Lib: lib, SysfsRoot: pciTree(t, 0), Interval: 200 * time.Millisecond})
	time.Sleep(time.Second)
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, &gpuv1alpha1.GPUNode{}); !apierrors.IsNotFound(err) {
		t.Errorf("GPUNode of a CPU node without a driver: %v", err)
	}
}
