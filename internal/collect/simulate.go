package collect

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// SimulatedSystems are the systems Simulate can build, on go-nvml's mock
// servers.
var SimulatedSystems = map[string]struct {
	gpu gpus.Config
	new func(...gpus.Config) *server.Server
}{
	"dgx-a100": {gpus.A100_SXM4_40GB, dgxa100.NewWithGPUs},
	"dgx-h100": {gpus.H100_SXM5_80GB, dgxh100.NewWithGPUs},
	"dgx-h200": {gpus.H200_SXM5_141GB, dgxh200.NewWithGPUs},
	"dgx-b200": {gpus.B200_SXM5_180GB, dgxb200.NewWithGPUs},
}

// SimulatedSystemNames lists SimulatedSystems, sorted.
func SimulatedSystemNames() []string {
	names := make([]string, 0, len(SimulatedSystems))
	for n := range SimulatedSystems {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// SimOptions describe a simulated node.
type SimOptions struct {
	// System is one of SimulatedSystems.
	System string
	// GPUs is the number of GPUs (default 8; 0 simulates a node whose GPUs
	// are all gone).
	GPUs *int
	// MIG, when set, puts every GPU in MIG mode with these devices:
	// "PROFILE:COUNT[,PROFILE:COUNT...]", e.g. "3g.20gb:2" or "1g.5gb:7".
	MIG string
	// Seed makes UUIDs stable across restarts (use the node name).
	Seed string
	// Bare simulates a node whose driver is not (or no longer) loaded,
	// gated on BareLibrary(DriverRoot), the file a containerised driver
	// installs: while it does not exist, Init returns
	// ERROR_LIBRARY_NOT_FOUND and every other call (on the library, its
	// devices and its event sets) ERROR_DRIVER_NOT_LOADED, so that a driver
	// removed while the agent runs looks like a driver unloaded for an
	// upgrade; while it exists NVML works normally. DriverRoot is required.
	Bare       bool
	DriverRoot string
	// HostDriver simulates a driver installed on the host (a cloud GPU
	// image's): NVML works from the start, and Source says Host. Without
	// it a bare node's driver is Loom's containerised one (Source says
	// Container), and another node's cannot be told (Source says "").
	HostDriver bool
	// MIGFile, when set, is read by ReloadMIG: see there.
	MIGFile string
}

// BareLibrary is the file whose presence makes a bare simulated node's NVML
// work: <driver-root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1.
func BareLibrary(driverRoot string) string {
	return filepath.Join(driverRoot, "usr", "lib", "x86_64-linux-gnu", "libnvidia-ml.so.1")
}

// Simulator is a simulated NVML library. Besides what go-nvml's mock serves,
// it fills in the calls Collect and the agent need that the mock leaves
// unset (PCI bus IDs, MIG device handles, event sets), and can inject Xid
// events.
type Simulator struct {
	nvml.Interface
	events  chan nvml.EventData
	devs    []*server.Device
	bareLib string // BareLibrary(DriverRoot) in bare mode, else ""
	source  gpuv1alpha1.DriverSource
	migFile string
	migSeen *string // the MIG file content ReloadMIG last acted on

	mu           sync.Mutex
	registered   map[*server.Device]uint64
	remapPending map[int]bool
	dbe          map[int]uint64
	migs         map[migKey]nvml.Device // the MIG devices handed out
}

// Source is where the simulated driver comes from, as the agent's
// DriverLibrary reports it for a real one (see SimOptions.HostDriver).
func (s *Simulator) Source() gpuv1alpha1.DriverSource { return s.source }

// Simulate builds a simulated NVML library.
func Simulate(o SimOptions) (*Simulator, error) {
	sys, ok := SimulatedSystems[o.System]
	if !ok {
		return nil, fmt.Errorf("unknown simulated system %q; valid: %s", o.System, strings.Join(SimulatedSystemNames(), ", "))
	}
	n := 8
	if o.GPUs != nil {
		n = *o.GPUs
	}
	if n < 0 {
		return nil, fmt.Errorf("simulated GPU count must not be negative, got %d", n)
	}
	if o.Bare && o.DriverRoot == "" {
		return nil, fmt.Errorf("a bare simulated node needs a driver root")
	}
	if o.Bare && o.HostDriver {
		return nil, fmt.Errorf("a simulated node's driver is either the host's or a bare node's containerised one, not both")
	}
	srv := sys.new(gpus.Multiple(n, sys.gpu)...)
	s := &Simulator{Interface: srv, events: make(chan nvml.EventData, 64), registered: map[*server.Device]uint64{},
		remapPending: map[int]bool{}, dbe: map[int]uint64{}, migs: map[migKey]nvml.Device{}, migFile: o.MIGFile}
	switch {
	case o.Bare:
		s.bareLib, s.source = BareLibrary(o.DriverRoot), gpuv1alpha1.DriverContainer
	case o.HostDriver:
		s.source = gpuv1alpha1.DriverHost
	}
	migSpec, err := parseMIGSpec(o.MIG)
	if err != nil {
		return nil, err
	}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		s.devs = append(s.devs, dev)
		dev.UUID = stableUUID("GPU", o.Seed, o.System, strconv.Itoa(i))
		s.completeDevice(dev, o.Seed)
		if len(migSpec) > 0 {
			if err := createMIGDevices(dev, migSpec); err != nil {
				return nil, fmt.Errorf("GPU %d: %w", i, err)
			}
		}
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
				if s.driverGone() {
					return nvml.EventData{}, nvml.ERROR_DRIVER_NOT_LOADED
				}
				select {
				case e := <-s.events:
					return e, nvml.SUCCESS
				case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	if o.Bare {
		s.gateOnDriver(srv)
	}
	return s, nil
}

// InjectRowRemapPending makes GPU index report a pending row remap (NVML's
// GetRemappedRows), as after an uncorrectable error the driver will repair
// at the next reset; pending false withdraws it (the reset happened). It
// reports false for an index out of range. Until then GetRemappedRows is
// ERROR_NOT_SUPPORTED, as on GPUs without row remapping.
func (s *Simulator) InjectRowRemapPending(index int, pending bool) bool {
	if index < 0 || index >= len(s.devs) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remapPending[index] = pending
	return true
}

// InjectDoubleBitECC sets GPU index's volatile uncorrectable ECC counter
// (NVML's GetTotalEccErrors); it is ERROR_NOT_SUPPORTED until then.
func (s *Simulator) InjectDoubleBitECC(index int, count uint64) bool {
	if index < 0 || index >= len(s.devs) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dbe[index] = count
	return true
}

// PCIDevices are the simulated GPUs as the PCI bus would show them: the
// mock's bus IDs and PCI device IDs, class 3D controller.
func (s *Simulator) PCIDevices() []gpuv1alpha1.PCIDevice {
	out := make([]gpuv1alpha1.PCIDevice, 0, len(s.devs))
	for _, d := range s.devs {
		out = append(out, gpuv1alpha1.PCIDevice{BusID: d.PciBusID, DeviceID: fmt.Sprintf("0x%04x", d.Config.PciDeviceId>>16),
			Class: "0x030200"})
	}
	return out
}

// InjectXid delivers a critical Xid event for GPU index, as the driver would.
// It reports false when no event set has registered for that GPU.
func (s *Simulator) InjectXid(index int, xid uint64) bool {
	if index < 0 || index >= len(s.devs) {
		return false
	}
	s.mu.Lock()
	mask := s.registered[s.devs[index]]
	s.mu.Unlock()
	if mask&nvml.EventTypeXidCriticalError == 0 {
		return false
	}
	s.events <- nvml.EventData{Device: s.devs[index], EventType: nvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	return true
}

func (s *Simulator) completeDevice(dev *server.Device, seed string) {
	// Some mock configurations call themselves "Mock NVIDIA ..."; a simulated
	// fleet should read like a real one.
	name := strings.TrimPrefix(dev.Config.Name, "Mock ")
	dev.GetNameFunc = func() (string, nvml.Return) { return name, nvml.SUCCESS }
	dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p := nvml.PciInfo{PciDeviceId: dev.Config.PciDeviceId}
		for i := 0; i < len(dev.PciBusID) && i < len(p.BusId)-1; i++ {
			p.BusId[i] = int8(dev.PciBusID[i])
		}
		return p, nvml.SUCCESS
	}
	dev.RegisterEventsFunc = func(mask uint64, _ nvml.EventSet) nvml.Return {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.registered[dev] |= mask
		return nvml.SUCCESS
	}
	dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
	}
	dev.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		pending, ok := s.remapPending[dev.Index]
		if !ok {
			return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
		}
		if pending {
			return 0, 1, true, false, nvml.SUCCESS
		}
		return 0, 0, false, false, nvml.SUCCESS
	}
	dev.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		n, ok := s.dbe[dev.Index]
		if !ok || t != nvml.MEMORY_ERROR_TYPE_UNCORRECTED || c != nvml.VOLATILE_ECC {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return n, nvml.SUCCESS
	}
	dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	dev.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		keys := migKeys(dev)
		if i < 0 || i >= len(keys) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return s.migDevice(keys[i], seed), nvml.SUCCESS
	}
}

// migKey is one MIG device of a mock GPU: its GPU and compute instance IDs
// and their profiles, from which everything its handle answers follows.
type migKey struct {
	dev                  *server.Device
	gi, ci               uint32
	giProfile, ciProfile int
}

// migKeys lists the MIG devices of a mock GPU: one per compute instance,
// ordered by GPU instance and compute instance ID.
func migKeys(dev *server.Device) []migKey {
	dev.RLock()
	defer dev.RUnlock()
	var keys []migKey
	for gi := range dev.GpuInstances {
		for ci := range gi.ComputeInstances {
			keys = append(keys, migKey{dev: dev, gi: gi.Info.Id, ci: ci.Info.Id,
				giProfile: int(gi.Info.ProfileId), ciProfile: int(ci.Info.ProfileId)})
		}
	}
	slices.SortFunc(keys, func(a, b migKey) int {
		if c := cmp.Compare(a.gi, b.gi); c != 0 {
			return c
		}
		return cmp.Compare(a.ci, b.ci)
	})
	return keys
}

// migDevice is the handle of MIG device k, made once and then handed out
// again: a collection asks for every MIG device's handle, and a mock device
// is a large struct (building each GPU's list for each handle cost a
// collection of 8 GPUs × 7 devices 6.8 MB and 2.8 ms).
func (s *Simulator) migDevice(k migKey, seed string) nvml.Device {
	s.mu.Lock()
	d, ok := s.migs[k]
	s.mu.Unlock()
	if ok {
		return d
	}
	info := k.dev.Config.MIGProfiles.GpuInstanceProfiles[k.giProfile]
	ciInfo := k.dev.Config.MIGProfiles.ComputeInstanceProfiles[k.giProfile][k.ciProfile]
	uuid := stableUUID("MIG", seed, k.dev.UUID, strconv.Itoa(int(k.gi)), strconv.Itoa(int(k.ci)))
	m := &mock.Device{
		GetUUIDFunc:              func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return int(k.gi), nvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { return int(k.ci), nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: info.MemorySizeMB << 20}, nvml.SUCCESS
		},
		GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{
				GpuInstanceSliceCount:     info.SliceCount,
				ComputeInstanceSliceCount: ciInfo.SliceCount,
				MemorySizeMB:              info.MemorySizeMB,
				MultiprocessorCount:       ciInfo.MultiprocessorCount,
			}, nvml.SUCCESS
		},
	}
	if s.bareLib != "" {
		s.gateFuncs(reflect.ValueOf(m).Elem())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.migs[k]; ok {
		return d // another caller's, made meanwhile
	}
	s.migs[k] = m
	return m
}

type migRequest struct {
	profile string
	count   int
}

func parseMIGSpec(spec string) ([]migRequest, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, nil
	}
	var out []migRequest
	for _, part := range strings.Split(spec, ",") {
		name, countStr, found := strings.Cut(strings.TrimSpace(part), ":")
		count := 1
		if found {
			c, err := strconv.Atoi(countStr)
			if err != nil || c < 1 {
				return nil, fmt.Errorf("MIG spec %q: count must be a positive integer", part)
			}
			count = c
		}
		out = append(out, migRequest{profile: name, count: count})
	}
	return out, nil
}

// createMIGDevices enables MIG on a mock GPU and creates GPU instances (each
// with one full-size compute instance) through the mock's own NVML calls.
func createMIGDevices(dev *server.Device, reqs []migRequest) error {
	infos, err := resolveMIG(dev, reqs)
	if err != nil {
		return err
	}
	return createInstances(dev, infos)
}

// createInstances enables MIG and creates the GPU instances, each with one
// compute instance of its size.
func createInstances(dev *server.Device, infos []nvml.GpuInstanceProfileInfo) error {
	if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		return check("nvmlDeviceSetMigMode", ret)
	}
	for _, info := range infos {
		gi, ret := dev.CreateGpuInstance(&info)
		if ret != nvml.SUCCESS {
			return check("nvmlDeviceCreateGpuInstance", ret)
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfileForSlices(info.SliceCount), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			return check("nvmlGpuInstanceGetComputeInstanceProfileInfo", ret)
		}
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			return check("nvmlGpuInstanceCreateComputeInstance", ret)
		}
	}
	return nil
}

// resolveMIG checks a MIG spec against a mock GPU's profiles and its seven
// compute slices, and lists the GPU instance profiles to create.
func resolveMIG(dev *server.Device, reqs []migRequest) ([]nvml.GpuInstanceProfileInfo, error) {
	profiles := map[string]nvml.GpuInstanceProfileInfo{}
	var names []string
	for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		if ret != nvml.SUCCESS {
			continue
		}
		name := MIGProfileName(info.SliceCount, info.SliceCount, info.MemorySizeMB)
		if _, dup := profiles[name]; !dup {
			profiles[name] = info
			names = append(names, name)
		}
	}
	var out []nvml.GpuInstanceProfileInfo
	slices := uint32(0)
	for _, r := range reqs {
		info, ok := profiles[r.profile]
		if !ok {
			sort.Strings(names)
			return nil, fmt.Errorf("MIG profile %q not offered by %s; offered: %s", r.profile, dev.Config.Name, strings.Join(names, ", "))
		}
		for range r.count {
			slices += info.SliceCount
			if slices > 7 {
				return nil, fmt.Errorf("MIG spec needs more than the GPU's 7 compute slices")
			}
			out = append(out, info)
		}
	}
	return out, nil
}

func ciProfileForSlices(slices uint32) int {
	switch slices {
	case 1:
		return nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE
	case 2:
		return nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE
	case 3:
		return nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE
	case 4:
		return nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE
	case 6:
		return nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE
	case 7:
		return nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE
	default:
		return nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE
	}
}

// stableUUID derives a UUID-shaped identifier from its parts, so a simulated
// node keeps its GPU UUIDs across agent restarts.
func stableUUID(prefix string, parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "/")))
	return fmt.Sprintf("%s-%x-%x-%x-%x-%x", prefix, h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}
