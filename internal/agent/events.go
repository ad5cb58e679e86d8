package agent

import (
	"context"
	"errors"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// Xids that an application causes (bad memory access, user-initiated
// resets, ...) and that say nothing about the GPU's health; the NVIDIA device
// plugin skips the same ones.
var applicationXids = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

const watchedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError

// watchEvents marks GPUs unhealthy on critical Xid and double-bit ECC events
// and triggers a collection at once. Drivers without event support leave the
// agent on its interval.
func (a *Agent) watchEvents(ctx context.Context) {
	set, ret := a.Lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		a.Log.Info("NVML event sets unsupported; collecting on the interval only", "reason", nvml.ErrorString(ret))
		return
	}
	defer func() { _ = set.Free() }()
	count, ret := a.Lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return
	}
	registered := 0
	for i := range count {
		dev, ret := a.Lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		supported, ret := dev.GetSupportedEventTypes()
		if ret != nvml.SUCCESS || supported&watchedEvents == 0 {
			continue
		}
		if ret := dev.RegisterEvents(supported&watchedEvents, set); ret == nvml.SUCCESS {
			registered++
		}
	}
	if registered == 0 {
		return
	}
	for ctx.Err() == nil {
		e, ret := set.Wait(1000)
		if ret == nvml.ERROR_TIMEOUT {
			continue
		}
		if ret != nvml.SUCCESS {
			// The driver may be going away: a collection finds out (and
			// ends this NVML session); meanwhile wait a little.
			a.Log.Error(errors.New(nvml.ErrorString(ret)), "waiting for NVML events")
			a.collectNow()
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		a.handleEvent(e)
	}
}

// collectNow asks the run loop for a collection.
func (a *Agent) collectNow() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

func (a *Agent) handleEvent(e nvml.EventData) {
	if e.Device == nil {
		return
	}
	uuid, ret := e.Device.GetUUID()
	if ret != nvml.SUCCESS {
		// A GPU that cannot be named (fallen off the bus, Xid 79): the
		// collection lists it unhealthy (GPULost), so collect now.
		a.Log.Info("GPU event from a GPU NVML cannot name; collecting", "event", e.EventType, "xid", e.EventData, "error", nvml.ErrorString(ret))
		a.collectNow()
		return
	}
	var h gpuv1alpha1.GPUHealth
	switch e.EventType {
	case nvml.EventTypeXidCriticalError:
		if applicationXids[e.EventData] {
			a.Log.Info("application Xid, GPU stays healthy", "gpu", uuid, "xid", e.EventData)
			return
		}
		h = gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthXidCriticalError,
			Message: xidMessage(e.EventData), Xid: int64(e.EventData)}
	case nvml.EventTypeDoubleBitEccError:
		h = gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthDoubleBitECC,
			Message: "uncorrectable (double-bit) ECC error event"}
	default:
		return
	}
	a.Log.Info("GPU unhealthy", "gpu", uuid, "reason", h.Reason, "message", h.Message)
	a.markUnhealthy(uuid, h)
	a.collectNow()
}
