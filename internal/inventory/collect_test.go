package inventory

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

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
