package agent

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
)

// overLib is a driver that reports more than the GPUNode schema admits:
// 70 GPUs (the simulated eight, again and again), each with 70 MIG
// devices, names, UUIDs and a driver version longer than their fields.
type overLib struct{ nvml.Interface }

type overDevice struct {
	nvml.Device
	index int
}

func (overLib) SystemGetDriverVersion() (string, nvml.Return) {
	return strings.Repeat("570.", 50), nvml.SUCCESS
}
func (overLib) DeviceGetCount() (int, nvml.Return) { return 70, nvml.SUCCESS }
func (l overLib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	d, ret := l.Interface.DeviceGetHandleByIndex(i % 8)
	return overDevice{d, i}, ret
}
func (overDevice) GetName() (string, nvml.Return) {
	return strings.Repeat("NVIDIA H100 ", 30), nvml.SUCCESS
}
func (d overDevice) GetUUID() (string, nvml.Return) {
	return fmt.Sprintf("GPU-%d-%s", d.index, strings.Repeat("0", 300)), nvml.SUCCESS
}
func (overDevice) GetMaxMigDeviceCount() (int, nvml.Return) { return 70, nvml.SUCCESS }
func (d overDevice) GetMigDeviceHandleByIndex(i int) (nvml.Device, nvml.Return) {
	return d.Device.GetMigDeviceHandleByIndex(i % 7)
}

// A node that reports more than the status admits still reports: the
// agent writes what fits (strings cut, the first 64 GPUs and MIG devices
// kept), the Truncated condition says what was cut, and neither a second
// collection nor a restarted agent writes again.
func TestAgentBoundsWhatNVMLReportsToTheSchema(t *testing.T) {
	const node = "agent-over-limits"
	lib := func() nvml.Interface {
		return overLib{sim(t, collect.SimOptions{System: "dgx-h100", MIG: "1g.10gb:7", Seed: node})}
	}
	r := start(t, node, lib(), "")
	gn := waitFor(t, node, "Ready and Truncated", func(gn *gpuv1alpha1.GPUNode) bool {
		return isReady(gn) && meta.IsStatusConditionTrue(gn.Status.Conditions, gpuv1alpha1.ConditionTruncated)
	})
	st := gn.Status
	if st.GPUCount != 64 || len(st.GPUs) != 64 || st.GPUs[63].Index != 63 {
		t.Errorf("%d GPUs (count %d), want the first 64", len(st.GPUs), st.GPUCount)
	}
	if n := len(st.GPUs[0].MIG.Devices); n != 64 {
		t.Errorf("GPU 0 has %d MIG devices, want the first 64", n)
	}
	if n := utf8.RuneCountInString(st.DriverVersion); n != 128 {
		t.Errorf("driver version of %d characters, want it cut to 128", n)
	}
	if n := len(st.GPUs[0].Product); n != 256 || st.Product != st.GPUs[0].Product {
		t.Errorf("product of %d characters (node: %q), want 256", n, st.Product)
	}
	if u := st.GPUs[5].UUID; len(u) != 256 || !strings.HasPrefix(u, "GPU-5-") {
		t.Errorf("GPU 5's UUID %q, want its first 256 characters", u)
	}
	c := meta.FindStatusCondition(st.Conditions, gpuv1alpha1.ConditionTruncated)
	for _, want := range []string{"gpus: 70 GPUs, the first 64 kept", "gpus[].mig.devices: up to 70 MIG devices (64 times), the first 64 kept",
		"driverVersion: 200 characters, cut to 128", "gpus[].product: up to 360 characters (64 times), cut to 256"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("Truncated says %q, want it to say %q", c.Message, want)
		}
	}
	if c.Reason != gpuv1alpha1.ReasonTooManyGPUs {
		t.Errorf("Truncated's reason %s, want %s", c.Reason, gpuv1alpha1.ReasonTooManyGPUs)
	}

	// Cut the same way every time: nothing more to write.
	waitWrites(t, r, 2)
	r.agent.collectNow()
	time.Sleep(300 * time.Millisecond)
	if w := testutil.ToFloat64(r.agent.Metrics.writes); w != 2 {
		t.Errorf("an unchanged collection wrote (%v writes)", w)
	}
	r.stop()
	r2 := start(t, node, lib(), "")
	time.Sleep(time.Second)
	if w := testutil.ToFloat64(r2.agent.Metrics.writes); w != 0 {
		t.Errorf("a restarted agent wrote %v times", w)
	}
}

// waitWrites waits until the agent counted n writes (it counts one once
// its response is back, which may be after the write is readable).
func waitWrites(t *testing.T, r *running, n float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(r.agent.Metrics.writes) < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// A status within the limits is not touched, and says nothing was cut.
func TestBoundLeavesAWholeInventory(t *testing.T) {
	st, err := collect.Collect(sim(t, collect.SimOptions{System: "dgx-h100", MIG: "1g.10gb:7", Seed: t.Name()}), nil)
	if err != nil {
		t.Fatal(err)
	}
	before := *st.DeepCopy()
	if cut := bound(&st); len(cut.cuts) != 0 || cut.reason != "" {
		t.Errorf("cut %+v", cut)
	}
	if !reflect.DeepEqual(before, st) {
		t.Error("a whole inventory changed")
	}
	if got := truncate("Ünïcödé", 3); got != "Ünï" {
		t.Errorf("truncate = %q, want the first 3 characters", got)
	}
}
