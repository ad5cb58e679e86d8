package agent

import (
	"bufio"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// A privileged container holds every capability; the chart's unprivileged
// agent drops them all.
func TestWithoutSysAdmin(t *testing.T) {
	for _, tc := range []struct {
		name, status string
		want         bool
	}{
		{"privileged", "Name:\tloom-node-agent\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n", false},
		{"every capability dropped", "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n", true},
		{"a runtime's default set", "CapEff:\t00000000a80425fb\n", true},
		{"CAP_SYS_ADMIN added", "CapEff:\t0000000000200000\n", false},
		{"no CapEff", "Name:\tx\n", false},
		{"garbage", "CapEff:\tzz\n", false},
	} {
		if got := withoutSysAdmin(bufio.NewScanner(strings.NewReader(tc.status))); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// An agent run unprivileged, NVML failing, says so (Unprivileged, not a
// driver missing, and no retry to wait for: Reconciling False), reports
// the PCI bus, and counts publishing it as its collection, so that the
// alert on an agent that stops reporting still sees it working.
func TestUnprivilegedAgentSaysSo(t *testing.T) {
	const node = "agent-unprivileged"
	lib := dgxh100.New()
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	r := startAgent(t, &Agent{NodeName: node, Lib: lib, SysfsRoot: pciTree(t, 8), Unprivileged: true})
	gn := waitFor(t, node, "NVMLUnavailable Unprivileged", nvmlUnavailable(gpuv1alpha1.ReasonUnprivileged))
	ready := meta.FindStatusCondition(gn.Status.Conditions, gpuv1alpha1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != gpuv1alpha1.ReasonUnprivileged ||
		!strings.Contains(ready.Message, "nodeAgent.privileged=false") || len(gn.Status.PCIDevices) != 8 {
		t.Errorf("Ready %+v, PCI %d", ready, len(gn.Status.PCIDevices))
	}
	if meta.IsStatusConditionTrue(gn.Status.Conditions, gpuv1alpha1.ConditionReconciling) {
		t.Errorf("Reconciling True for a configuration: %+v", gn.Status.Conditions)
	}
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(r.agent.Metrics.lastSuccess) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if testutil.ToFloat64(r.agent.Metrics.lastSuccess) == 0 {
		t.Error("no last success after publishing the PCI bus")
	}
}
