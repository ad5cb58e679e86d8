package collect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

func simulate(t *testing.T, o SimOptions) *Simulator {
	t.Helper()
	s, err := Simulate(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCollectSimulatedSystems(t *testing.T) {
	tests := []struct {
		system, product, arch, cc string
		memMiB                    int64
	}{
		{"dgx-a100", "NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 40960},
		{"dgx-h100", "NVIDIA H100 80GB HBM3", "Hopper", "9.0", 81920},
		{"dgx-h200", "NVIDIA H200 141GB HBM3e", "Hopper", "9.0", 144384},
		{"dgx-b200", "NVIDIA B200 180GB HBM3e", "Blackwell", "10.0", 184320},
	}
	for _, tt := range tests {
		t.Run(tt.system, func(t *testing.T) {
			st, err := Collect(simulate(t, SimOptions{System: tt.system, Seed: "node-a"}), nil)
			if err != nil {
				t.Fatal(err)
			}
			if st.GPUCount != 8 || len(st.GPUs) != 8 {
				t.Fatalf("GPUCount = %d, %d GPUs", st.GPUCount, len(st.GPUs))
			}
			if st.DriverVersion == "" || st.NVMLVersion == "" || st.CUDADriverVersion == "" {
				t.Errorf("versions missing: %+v", st)
			}
			g := st.GPUs[3]
			if g.Index != 3 || g.Product != tt.product || g.Architecture != tt.arch || g.ComputeCapability != tt.cc || g.MemoryMiB != tt.memMiB {
				t.Errorf("GPU 3 = %+v", g)
			}
			if !strings.HasPrefix(g.UUID, "GPU-") || g.PCIBusID != "0000:03:00.0" || g.Health.State != gpuv1alpha1.GPUHealthy {
				t.Errorf("GPU 3 identity/health = %q %q %+v", g.UUID, g.PCIBusID, g.Health)
			}
			if st.Product != tt.product || st.MIG != "Disabled" {
				t.Errorf("summary product %q MIG %q", st.Product, st.MIG)
			}
		})
	}
}

func TestCollectIsStableAcrossRestarts(t *testing.T) {
	a, _ := Collect(simulate(t, SimOptions{System: "dgx-h100", Seed: "node-a", MIG: "3g.40gb:2"}), nil)
	b, _ := Collect(simulate(t, SimOptions{System: "dgx-h100", Seed: "node-a", MIG: "3g.40gb:2"}), nil)
	c, _ := Collect(simulate(t, SimOptions{System: "dgx-h100", Seed: "node-b"}), nil)
	if a.GPUs[0].UUID != b.GPUs[0].UUID || a.GPUs[0].MIG.Devices[1].UUID != b.GPUs[0].MIG.Devices[1].UUID {
		t.Fatal("UUIDs differ between two simulations of the same node")
	}
	if a.GPUs[0].UUID == c.GPUs[0].UUID {
		t.Fatal("two nodes share GPU UUIDs")
	}
}

func TestCollectMIG(t *testing.T) {
	st, err := Collect(simulate(t, SimOptions{System: "dgx-a100", Seed: "n", MIG: "3g.20gb:1,2g.10gb:1,1g.5gb:2"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.MIG != "Enabled" {
		t.Errorf("MIG summary %q", st.MIG)
	}
	m := st.GPUs[0].MIG
	if m == nil || !m.Capable || m.CurrentMode != gpuv1alpha1.MIGEnabled || m.PendingMode != gpuv1alpha1.MIGEnabled {
		t.Fatalf("MIG = %+v", m)
	}
	var profiles []string
	for _, d := range m.Devices {
		profiles = append(profiles, d.Profile)
		if !strings.HasPrefix(d.UUID, "MIG-") || d.MemoryMiB == 0 {
			t.Errorf("MIG device %+v", d)
		}
	}
	if got := strings.Join(profiles, ","); got != "3g.20gb,2g.10gb,1g.5gb,1g.5gb" {
		t.Errorf("profiles = %s", got)
	}
	if m.Devices[0].GPUInstanceID != 0 || m.Devices[3].GPUInstanceID != 3 {
		t.Errorf("GPU instance IDs %+v", m.Devices)
	}
}

func TestSimulateRejectsBadInput(t *testing.T) {
	for _, o := range []SimOptions{
		{System: "dgx-z9"},
		{System: "dgx-a100", MIG: "9g.99gb:1"},
		{System: "dgx-a100", MIG: "1g.5gb:8"},
		{System: "dgx-a100", MIG: "1g.5gb:x"},
		{System: "dgx-a100", GPUs: ptrInt(-1)},
	} {
		if _, err := Simulate(o); err == nil {
			t.Errorf("Simulate(%+v) accepted", o)
		}
	}
}

func TestCollectZeroGPUs(t *testing.T) {
	st, err := Collect(simulate(t, SimOptions{System: "dgx-h100", GPUs: ptrInt(0)}), nil)
	if err != nil || st.GPUCount != 0 || st.Product != "" {
		t.Fatalf("%+v, %v", st, err)
	}
}

// The plain go-nvml mock (no simulator additions) reports what it can; a call
// that fails surfaces NVML's own error text.
func TestCollectReportsNVMLErrors(t *testing.T) {
	srv := dgxh100.New()
	srv.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", nvml.ERROR_DRIVER_NOT_LOADED }
	_, err := Collect(srv, nil)
	if err == nil || !strings.Contains(err.Error(), "nvmlSystemGetDriverVersion: "+nvml.ErrorString(nvml.ERROR_DRIVER_NOT_LOADED)) {
		t.Fatalf("error = %v", err)
	}
}

func TestMIGProfileName(t *testing.T) {
	for _, tt := range []struct {
		gi, ci uint32
		mem    uint64
		want   string
	}{
		{1, 1, 4864, "1g.5gb"}, {7, 7, 40192, "7g.40gb"}, {3, 3, 19968, "3g.20gb"},
		{1, 1, 9856, "1g.10gb"}, {4, 2, 20096, "2c.4g.20gb"},
	} {
		if got := MIGProfileName(tt.gi, tt.ci, tt.mem); got != tt.want {
			t.Errorf("MIGProfileName(%d,%d,%d) = %s, want %s", tt.gi, tt.ci, tt.mem, got, tt.want)
		}
	}
}

func ptrInt(i int) *int { return &i }

// A bare simulated node: NVML works only while the driver's library exists.
func TestSimulateBare(t *testing.T) {
	root := t.TempDir()
	s := simulate(t, SimOptions{System: "dgx-h100", Seed: "n", Bare: true, DriverRoot: root})
	if ret := s.Init(); ret != nvml.ERROR_LIBRARY_NOT_FOUND {
		t.Fatalf("Init without the library = %v", nvml.ErrorString(ret))
	}
	lib := BareLibrary(root)
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if ret := s.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init with the library = %v", nvml.ErrorString(ret))
	}
	st, err := Collect(s, nil)
	if err != nil || st.GPUCount != 8 {
		t.Fatalf("%d GPUs, %v", st.GPUCount, err)
	}
	dev, _ := s.DeviceGetHandleByIndex(0)
	if err := os.Remove(lib); err != nil {
		t.Fatal(err)
	}
	if _, err := Collect(s, nil); err == nil || !strings.Contains(err.Error(), nvml.ErrorString(nvml.ERROR_DRIVER_NOT_LOADED)) {
		t.Errorf("collection after the driver went: %v", err)
	}
	if _, ret := dev.GetUUID(); ret != nvml.ERROR_DRIVER_NOT_LOADED {
		t.Errorf("a device call after the driver went = %v", nvml.ErrorString(ret))
	}
	if _, err := Simulate(SimOptions{System: "dgx-h100", Bare: true}); err == nil {
		t.Error("bare without a driver root accepted")
	}
}

// A simulated node says where its driver comes from as the agent's NVML
// loader does for a real one: a host driver's (working from the start) is
// Host, a bare node's (Loom's driver container) Container, another's
// cannot be told.
func TestSimulatedDriverSource(t *testing.T) {
	for _, tt := range []struct {
		name string
		o    SimOptions
		want gpuv1alpha1.DriverSource
	}{
		{"host driver", SimOptions{HostDriver: true}, gpuv1alpha1.DriverHost},
		{"bare", SimOptions{Bare: true, DriverRoot: t.TempDir()}, gpuv1alpha1.DriverContainer},
		{"neither", SimOptions{}, ""},
	} {
		tt.o.System, tt.o.Seed = "dgx-h100", "n"
		s := simulate(t, tt.o)
		if got := s.Source(); got != tt.want {
			t.Errorf("%s: Source() = %q, want %q", tt.name, got, tt.want)
		}
		if tt.o.HostDriver {
			if ret := s.Init(); ret != nvml.SUCCESS {
				t.Errorf("%s: Init = %v, want a working driver from the start", tt.name, nvml.ErrorString(ret))
			}
		}
	}
	if _, err := Simulate(SimOptions{System: "dgx-h100", Bare: true, DriverRoot: t.TempDir(), HostDriver: true}); err == nil {
		t.Error("a bare node with a host driver accepted")
	}
}

func TestSimulatedPCIDevices(t *testing.T) {
	devs := simulate(t, SimOptions{System: "dgx-a100", GPUs: ptrInt(2)}).PCIDevices()
	if len(devs) != 2 || devs[1].BusID != "0000:01:00.0" || devs[1].DeviceID != "0x20b0" || devs[1].Class != "0x030200" {
		t.Fatalf("%+v", devs)
	}
}

func migProfiles(t *testing.T, s *Simulator) []string {
	t.Helper()
	st, err := Collect(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range st.GPUs {
		var p []string
		if g.MIG != nil && g.MIG.CurrentMode == gpuv1alpha1.MIGEnabled {
			for _, d := range g.MIG.Devices {
				p = append(p, d.Profile)
			}
		} else {
			p = append(p, "off")
		}
		out = append(out, strings.Join(p, ","))
	}
	return out
}

func TestSimulatedMIGFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mig")
	s := simulate(t, SimOptions{System: "dgx-a100", GPUs: ptrInt(2), Seed: "n", MIG: "7g.40gb:1", MIGFile: file})
	write := func(content string) {
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ReloadMIG(); err != nil {
		t.Fatalf("missing file: %v", err)
	}
	steps := []struct {
		content, want, wantErr string
	}{
		{"1g.5gb:7\n", "1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb 1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb", ""},
		{"3g.20gb:1,2g.10gb:1\ndisabled\n", "3g.20gb,2g.10gb off", ""},
		{"1g.5gb:8", "3g.20gb,2g.10gb off", "more than the GPU's 7 compute slices"},
		{"9g.99gb:1", "3g.20gb,2g.10gb off", `MIG profile "9g.99gb" not offered`},
		{"disabled\ndisabled\ndisabled", "3g.20gb,2g.10gb off", "3 lines for 2 GPUs"},
		{"disabled", "off off", ""},
	}
	for _, st := range steps {
		write(st.content)
		err := s.ReloadMIG()
		if st.wantErr == "" && err != nil || st.wantErr != "" && (err == nil || !strings.Contains(err.Error(), st.wantErr)) {
			t.Errorf("%q: error %v, want %q", st.content, err, st.wantErr)
		}
		if got := strings.Join(migProfiles(t, s), " "); got != st.want {
			t.Errorf("%q: GPUs %s, want %s", st.content, got, st.want)
		}
	}
	// The same layout again gives the same MIG UUIDs.
	write("2g.10gb:1")
	_ = s.ReloadMIG()
	a, _ := Collect(s, nil)
	write("2g.10gb:1\n")
	_ = s.ReloadMIG()
	b, _ := Collect(s, nil)
	if a.GPUs[0].MIG.Devices[0].UUID != b.GPUs[0].MIG.Devices[0].UUID {
		t.Error("re-applying a layout changed MIG UUIDs")
	}
}

func TestCheckHealth(t *testing.T) {
	s := simulate(t, SimOptions{System: "dgx-h100", GPUs: ptrInt(3), Seed: "n"})
	s.InjectRowRemapPending(0, true)
	s.InjectDoubleBitECC(2, 3)
	st, err := Collect(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h := st.GPUs[0].Health; h.Reason != gpuv1alpha1.HealthRowRemapPending {
		t.Errorf("GPU 0 %+v", h)
	}
	if h := st.GPUs[1].Health; h.State != gpuv1alpha1.GPUHealthy {
		t.Errorf("GPU 1 (checks unsupported) %+v", h)
	}
	if h := st.GPUs[2].Health; h.Reason != gpuv1alpha1.HealthDoubleBitECC || !strings.Contains(h.Message, "3 uncorrectable") {
		t.Errorf("GPU 2 %+v", h)
	}
}

// A MIG device's handle is made once: asking again (every collection asks
// for every one) gives the same device, gated like the GPUs' when the
// driver goes.
func TestSimulatedMIGHandles(t *testing.T) {
	root := t.TempDir()
	lib := BareLibrary(root)
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := simulate(t, SimOptions{System: "dgx-h100", GPUs: ptrInt(1), Seed: "n", MIG: "1g.10gb:7", Bare: true, DriverRoot: root})
	if ret := s.Init(); ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	dev, _ := s.DeviceGetHandleByIndex(0)
	a, ret := dev.GetMigDeviceHandleByIndex(6)
	if ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	b, _ := dev.GetMigDeviceHandleByIndex(6)
	other, _ := dev.GetMigDeviceHandleByIndex(5)
	if a != b || a == other {
		t.Error("the same MIG device's handle differs between calls, or two devices share one")
	}
	if _, ret := dev.GetMigDeviceHandleByIndex(7); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("an eighth MIG device of seven = %v", nvml.ErrorString(ret))
	}
	uuid, ret := a.GetUUID()
	if ret != nvml.SUCCESS || !strings.HasPrefix(uuid, "MIG-") {
		t.Fatalf("MIG UUID %q, %v", uuid, nvml.ErrorString(ret))
	}
	if err := os.Remove(lib); err != nil {
		t.Fatal(err)
	}
	if _, ret := a.GetUUID(); ret != nvml.ERROR_DRIVER_NOT_LOADED {
		t.Errorf("a MIG device call after the driver went = %v", nvml.ErrorString(ret))
	}
}

// One GPU NVML cannot read does not hide the others: it is listed
// unhealthy, with what could be read of it; a field a GPU does not support
// stays empty; only the driver gone ends the collection.
func TestCollectKeepsTheOtherGPUs(t *testing.T) {
	lostAll := func(d *server.Device) {
		d.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
		d.GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	}
	for _, tc := range []struct {
		name      string
		break3    func(*server.Device)
		err       bool
		reason    string // GPU 3's health reason; "" healthy
		uuidKnown bool
	}{
		{"fallen off the bus", lostAll, false, gpuv1alpha1.HealthGPULost, false},
		{"memory read fails", func(d *server.Device) {
			d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_UNKNOWN }
		}, false, gpuv1alpha1.HealthUnreadable, true},
		{"memory not supported", func(d *server.Device) {
			d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
		}, false, "", true},
		{"the driver unloaded", func(d *server.Device) {
			d.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNINITIALIZED }
		}, true, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := simulate(t, SimOptions{System: "dgx-h100", Seed: "n"})
			tc.break3(srv.devs[3])
			st, err := Collect(srv, nil)
			if tc.err {
				if err == nil {
					t.Fatal("no error: the collection should end")
				}
				return
			}
			if err != nil {
				t.Fatalf("one GPU failed the node's collection: %v", err)
			}
			if st.GPUCount != 8 || len(st.GPUs) != 8 {
				t.Fatalf("%d GPUs", len(st.GPUs))
			}
			for _, g := range st.GPUs {
				want := ""
				if g.Index == 3 {
					want = tc.reason
				}
				if g.Health.Reason != want || (want == "") != (g.Health.State == gpuv1alpha1.GPUHealthy) {
					t.Errorf("GPU %d health %+v, want reason %q", g.Index, g.Health, want)
				}
			}
			if g := st.GPUs[3]; (g.UUID != "") != tc.uuidKnown {
				t.Errorf("GPU 3 UUID %q, known %v", g.UUID, tc.uuidKnown)
			}
		})
	}
}
