// Package collect reads a node's GPUs through NVML, from the driver or from
// go-nvml's mock servers (Simulate), for the node agent. It is apart from
// package inventory, the manager's side, so that the manager's binary links
// neither NVML nor the mock servers (whose tables are built at start).
package collect

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
)

// NVMLError is an NVML call that failed, with NVML's own error text.
type NVMLError struct {
	Call string
	Ret  nvml.Return
}

func (e *NVMLError) Error() string {
	return fmt.Sprintf("%s: %s", e.Call, nvml.ErrorString(e.Ret))
}

func check(call string, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &NVMLError{Call: call, Ret: ret}
}

// Collect reads the inventory from an initialised NVML library. Each GPU's
// health is what CheckHealth reads, unless health (keyed by GPU UUID: what
// the agent learnt from events and keeps) says otherwise.
func Collect(lib nvml.Interface, health map[string]gpuv1alpha1.GPUHealth) (gpuv1alpha1.GPUNodeStatus, error) {
	var st gpuv1alpha1.GPUNodeStatus
	var ret nvml.Return
	if st.DriverVersion, ret = lib.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return st, check("nvmlSystemGetDriverVersion", ret)
	}
	if st.NVMLVersion, ret = lib.SystemGetNVMLVersion(); ret != nvml.SUCCESS {
		return st, check("nvmlSystemGetNVMLVersion", ret)
	}
	cuda, ret := lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return st, check("nvmlSystemGetCudaDriverVersion", ret)
	}
	st.CUDADriverVersion = fmt.Sprintf("%d.%d", cuda/1000, (cuda%1000)/10)

	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return st, check("nvmlDeviceGetCount", ret)
	}
	for i := range count {
		gpu := gpuv1alpha1.GPU{Index: int32(i)}
		dev, ret := lib.DeviceGetHandleByIndex(i)
		err := check(fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d)", i), ret)
		if err == nil {
			gpu, err = collectGPU(dev, i)
		}
		if err != nil {
			var ne *NVMLError
			if errors.As(err, &ne) && DriverGone(ne.Ret) {
				return st, err
			}
			// One GPU NVML cannot read (fallen off the bus: Xid 79) does not
			// hide the others: it is listed, unhealthy, with what was read.
			gpu.Health = unreadable(err)
		}
		if h, ok := health[gpu.UUID]; ok && gpu.UUID != "" {
			gpu.Health = h
		}
		st.GPUs = append(st.GPUs, gpu)
	}
	inventory.Summarize(&st)
	return st, nil
}

// DriverGone: NVML answers ret when the library or the driver is gone (not
// loaded, unloaded for an upgrade, a version mismatch), for every GPU.
func DriverGone(ret nvml.Return) bool {
	switch ret {
	case nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_UNINITIALIZED,
		nvml.ERROR_LIB_RM_VERSION_MISMATCH, nvml.ERROR_FUNCTION_NOT_FOUND:
		return true
	}
	return false
}

// unreadable is the health of a GPU whose reading failed with err.
func unreadable(err error) gpuv1alpha1.GPUHealth {
	var ne *NVMLError
	if errors.As(err, &ne) && ne.Ret == nvml.ERROR_GPU_IS_LOST {
		return gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthGPULost,
			Message: "the GPU has fallen off the bus (" + err.Error() + "); it needs a reset or a reboot"}
	}
	return gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthUnreadable,
		Message: "NVML cannot read the GPU: " + err.Error()}
}

func collectGPU(dev nvml.Device, index int) (gpuv1alpha1.GPU, error) {
	g := gpuv1alpha1.GPU{Index: int32(index)}
	var ret nvml.Return
	if g.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return g, check(fmt.Sprintf("nvmlDeviceGetUUID(%d)", index), ret)
	}
	if g.Product, ret = dev.GetName(); ret != nvml.SUCCESS {
		return g, check(fmt.Sprintf("nvmlDeviceGetName(%d)", index), ret)
	}
	// Memory a GPU does not report (unified memory) stays 0.
	switch mem, ret := dev.GetMemoryInfo(); ret {
	case nvml.SUCCESS:
		g.MemoryMiB = int64(mem.Total / (1 << 20))
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return g, check(fmt.Sprintf("nvmlDeviceGetMemoryInfo(%d)", index), ret)
	}
	if arch, ret := dev.GetArchitecture(); ret == nvml.SUCCESS {
		g.Architecture = ArchitectureName(arch)
	}
	if major, minor, ret := dev.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		g.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}
	if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
		g.PCIBusID = cString(pci.BusId[:])
		if g.PCIBusID == "" {
			g.PCIBusID = cString(pci.BusIdLegacy[:])
		}
	}
	mig, err := collectMIG(dev, index)
	if err != nil {
		return g, err
	}
	g.MIG = mig
	g.Health = CheckHealth(dev)
	return g, nil
}

// CheckHealth reads what NVML can tell of a GPU's health without events:
// pending or failed row remaps, and uncorrectable (double-bit) ECC errors
// since the last reset (the volatile counter). A check the GPU or driver
// does not support (ERROR_NOT_SUPPORTED) or that fails says nothing: the
// GPU is healthy as far as this goes.
func CheckHealth(dev nvml.Device) gpuv1alpha1.GPUHealth {
	if _, _, pending, failed, ret := dev.GetRemappedRows(); ret == nvml.SUCCESS {
		switch {
		case failed:
			return gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthRowRemapFailure,
				Message: "memory row remapping failed: no spare rows left; the GPU needs replacing"}
		case pending:
			return gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthRowRemapPending,
				Message: "a memory row remap is pending; it takes effect at the next GPU reset"}
		}
	}
	if n, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS && n > 0 {
		return gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthDoubleBitECC,
			Message: fmt.Sprintf("%d uncorrectable (double-bit) ECC errors since the last reset", n)}
	}
	return gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUHealthy}
}

// collectMIG reads MIG mode and devices; nil when the GPU cannot do MIG.
func collectMIG(dev nvml.Device, index int) (*gpuv1alpha1.MIGStatus, error) {
	current, pending, ret := dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return nil, nil
	}
	if ret != nvml.SUCCESS {
		return nil, check(fmt.Sprintf("nvmlDeviceGetMigMode(%d)", index), ret)
	}
	m := &gpuv1alpha1.MIGStatus{Capable: true, CurrentMode: migMode(current), PendingMode: migMode(pending)}
	if current != nvml.DEVICE_MIG_ENABLE {
		return m, nil
	}
	maxDevices, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, check(fmt.Sprintf("nvmlDeviceGetMaxMigDeviceCount(%d)", index), ret)
	}
	for i := range maxDevices {
		md, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // slot not populated
		}
		if ret != nvml.SUCCESS {
			return nil, check(fmt.Sprintf("nvmlDeviceGetMigDeviceHandleByIndex(%d, %d)", index, i), ret)
		}
		d, err := collectMIGDevice(md)
		if err != nil {
			return nil, fmt.Errorf("GPU %d MIG device %d: %w", index, i, err)
		}
		m.Devices = append(m.Devices, d)
	}
	sort.Slice(m.Devices, func(i, j int) bool {
		a, b := m.Devices[i], m.Devices[j]
		if a.GPUInstanceID != b.GPUInstanceID {
			return a.GPUInstanceID < b.GPUInstanceID
		}
		return a.ComputeInstanceID < b.ComputeInstanceID
	})
	return m, nil
}

func collectMIGDevice(md nvml.Device) (gpuv1alpha1.MIGDevice, error) {
	var d gpuv1alpha1.MIGDevice
	uuid, ret := md.GetUUID()
	if ret != nvml.SUCCESS {
		return d, check("nvmlDeviceGetUUID", ret)
	}
	gi, ret := md.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return d, check("nvmlDeviceGetGpuInstanceId", ret)
	}
	ci, ret := md.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return d, check("nvmlDeviceGetComputeInstanceId", ret)
	}
	attrs, ret := md.GetAttributes()
	if ret != nvml.SUCCESS {
		return d, check("nvmlDeviceGetAttributes", ret)
	}
	d.UUID, d.GPUInstanceID, d.ComputeInstanceID = uuid, int32(gi), int32(ci)
	d.MemoryMiB = int64(attrs.MemorySizeMB)
	d.Profile = MIGProfileName(attrs.GpuInstanceSliceCount, attrs.ComputeInstanceSliceCount, attrs.MemorySizeMB)
	return d, nil
}

// MIGProfileName names a MIG device the way nvidia-smi and the device plugin
// do: "<g>g.<mem>gb", prefixed "<c>c." when the compute instance is smaller
// than its GPU instance. Memory rounds up to whole GB.
func MIGProfileName(giSlices, ciSlices uint32, memoryMB uint64) string {
	gb := uint64(math.Ceil(float64(memoryMB) / 1024))
	name := fmt.Sprintf("%dg.%dgb", giSlices, gb)
	if ciSlices != 0 && ciSlices != giSlices {
		name = fmt.Sprintf("%dc.%s", ciSlices, name)
	}
	return name
}

// ArchitectureName maps NVML's architecture enum to its name.
func ArchitectureName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	default:
		return fmt.Sprintf("Unknown(%d)", a)
	}
}

func migMode(m int) gpuv1alpha1.MIGMode {
	if m == nvml.DEVICE_MIG_ENABLE {
		return gpuv1alpha1.MIGEnabled
	}
	return gpuv1alpha1.MIGDisabled
}

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}
