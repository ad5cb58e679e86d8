package agent

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
)

// lostLib makes GPU 3 fall off the bus once lost is set: every call on it
// answers ERROR_GPU_IS_LOST, as NVML does after Xid 79.
type lostLib struct {
	nvml.Interface
	lost atomic.Bool
}

type lostDevice struct{ nvml.Device }

func (lostDevice) GetUUID() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
func (lostDevice) GetName() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }

func (l *lostLib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	d, ret := l.Interface.DeviceGetHandleByIndex(i)
	if i == 3 && l.lost.Load() {
		return lostDevice{d}, ret
	}
	return d, ret
}

// A GPU that falls off the bus is listed unhealthy (GPULost) under the name
// and product it had, the node says a GPU needs a person (Stalled), and
// the other GPUs are still read; once it is back, it is healthy again.
func TestLostGPUIsUnhealthyAndTheOthersStay(t *testing.T) {
	const node = "agent-lost-gpu"
	lib := &lostLib{Interface: sim(t, collect.SimOptions{System: "dgx-h100", Seed: node})}
	r := start(t, node, lib, "dgx-h100")
	before := waitFor(t, node, "Ready", isReady).Status.GPUs[3]
	lib.lost.Store(true)
	r.agent.collectNow()
	gn := waitFor(t, node, "GPU 3 lost and the node Stalled", func(gn *gpuv1alpha1.GPUNode) bool {
		return gpuHealth(gn, 3).Reason == gpuv1alpha1.HealthGPULost &&
			meta.IsStatusConditionTrue(gn.Status.Conditions, gpuv1alpha1.ConditionStalled)
	})
	if g := gn.Status.GPUs[3]; g.UUID != before.UUID || g.Product != before.Product || len(gn.Status.GPUs) != 8 {
		t.Fatalf("GPU 3 lost: %d GPUs, GPU 3 %s %q (was %s %q)", len(gn.Status.GPUs), g.UUID, g.Product, before.UUID, before.Product)
	}
	for i, g := range gn.Status.GPUs {
		if i != 3 && g.Health.State != gpuv1alpha1.GPUHealthy {
			t.Errorf("GPU %d: %+v", i, g.Health)
		}
	}
	lib.lost.Store(false)
	r.agent.collectNow()
	waitFor(t, node, "GPU 3 back and healthy", func(gn *gpuv1alpha1.GPUNode) bool {
		return gpuHealth(gn, 3).State == gpuv1alpha1.GPUHealthy && isReady(gn)
	})
}

// An event from a GPU NVML can no longer name asks for a collection, which
// finds the GPU lost.
func TestEventFromAnUnnamedGPUCollects(t *testing.T) {
	a := &Agent{Log: logr.Discard(), health: map[string]gpuv1alpha1.GPUHealth{}, trigger: make(chan struct{}, 1)}
	a.handleEvent(nvml.EventData{Device: lostDevice{}, EventType: nvml.EventTypeXidCriticalError, EventData: 79})
	select {
	case <-a.trigger:
	default:
		t.Fatal("no collection asked for")
	}
}

// A failed collection with no inventory yet does not claim to show one.
func TestCollectionFailedWithoutInventory(t *testing.T) {
	for _, tc := range []struct {
		inventory *gpuv1alpha1.GPUNodeStatus
		want      string
	}{
		{nil, "no inventory read through NVML yet"},
		{&gpuv1alpha1.GPUNodeStatus{}, "showing the last inventory"},
	} {
		st := composeStatus(statusInput{inventory: tc.inventory, collectErr: "nvmlDeviceGetCount: Unknown Error"})
		if r := meta.FindStatusCondition(st.Conditions, gpuv1alpha1.ConditionReady); r == nil || !strings.Contains(r.Message, tc.want) {
			t.Errorf("inventory %v: Ready %+v, want it to say %q", tc.inventory != nil, r, tc.want)
		}
	}
}
