package nodelabels

import (
	"maps"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/inventory"
)

func collected(t testing.TB, o collect.SimOptions) gpuv1alpha1.GPUNodeStatus {
	t.Helper()
	s, err := collect.Simulate(o)
	if err != nil {
		t.Fatal(err)
	}
	st, err := collect.Collect(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestLabels(t *testing.T) {
	tests := []struct {
		name   string
		sim    collect.SimOptions
		want   map[string]string
		absent []string
	}{
		{
			name: "DGX H100",
			sim:  collect.SimOptions{System: "dgx-h100"},
			want: map[string]string{
				gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelCount: "8", gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3", gpuv1alpha1.LabelMemory: "81920",
				gpuv1alpha1.LabelFamily: "hopper", gpuv1alpha1.LabelComputeMajor: "9", gpuv1alpha1.LabelComputeMinor: "0", gpuv1alpha1.LabelMIGCapable: "true",
				gpuv1alpha1.LabelMIGStrategy: "none", gpuv1alpha1.LabelDriverMajor: "550", gpuv1alpha1.LabelDriverMinor: "54", gpuv1alpha1.LabelDriverRevision: "15",
				gpuv1alpha1.LabelDriverFull: "550.54.15", gpuv1alpha1.LabelRuntimeMajor: "12", gpuv1alpha1.LabelRuntimeMinor: "4", gpuv1alpha1.LabelRuntimeFull: "12.4",
				gpuv1alpha1.LabelReplicas: "1",
			},
			absent: []string{"nvidia.com/gfd.timestamp"},
		},
		{
			name: "DGX A100 with mixed MIG",
			sim:  collect.SimOptions{System: "dgx-a100", GPUs: intPtr(2), MIG: "3g.20gb:1,1g.5gb:4"},
			want: map[string]string{
				gpuv1alpha1.LabelCount: "2", gpuv1alpha1.LabelProduct: "NVIDIA-A100-SXM4-40GB", gpuv1alpha1.LabelFamily: "ampere", gpuv1alpha1.LabelMIGStrategy: "mixed",
				"nvidia.com/mig-3g.20gb.count": "2", "nvidia.com/mig-1g.5gb.count": "8",
				"nvidia.com/mig-3g.20gb.memory": "19968", "nvidia.com/mig-1g.5gb.memory": "4864",
			},
		},
		{
			name:   "no GPUs",
			sim:    collect.SimOptions{System: "dgx-b200", GPUs: intPtr(0)},
			want:   map[string]string{},
			absent: []string{gpuv1alpha1.LabelPresent, gpuv1alpha1.LabelCount},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Labels(collected(t, tt.sim))
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
			for _, k := range tt.absent {
				if _, ok := got[k]; ok {
					t.Errorf("%s set", k)
				}
			}
			if len(tt.want) == 0 && len(got) != 0 {
				t.Errorf("labels on a node without GPUs: %v", got)
			}
			assertValid(t, got)
		})
	}
}

func assertValid(t testing.TB, labels map[string]string) {
	t.Helper()
	for k, v := range labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("label key %q: %v", k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("label %s value %q: %v", k, v, errs)
		}
		if !labellerKey(k) {
			t.Errorf("label %s is not among the labeller's keys (labellerKey)", k)
		}
	}
}

// Whatever NVML reports, the labels are valid Kubernetes labels.
func FuzzLabels(f *testing.F) {
	f.Add("NVIDIA H100 80GB HBM3", "Hopper", "9.0", "550.54.15", "12.4", "1g.10gb", int64(81920))
	f.Add("  weird/name!! ", "", "x", "1", "", "7g.80gb+me", int64(0))
	f.Fuzz(func(t *testing.T, product, arch, cc, driver, cuda, profile string, mem int64) {
		st := gpuv1alpha1.GPUNodeStatus{
			DriverVersion: driver, CUDADriverVersion: cuda,
			GPUs: []gpuv1alpha1.GPU{{Product: product, Architecture: arch, ComputeCapability: cc, MemoryMiB: mem,
				MIG: &gpuv1alpha1.MIGStatus{Capable: true, CurrentMode: gpuv1alpha1.MIGEnabled,
					Devices: []gpuv1alpha1.MIGDevice{{Profile: profile, MemoryMiB: mem}}}}},
		}
		inventory.Summarize(&st)
		assertValid(t, Labels(st))
	})
}

func intPtr(i int) *int { return &i }

// The ClusterPolicy's MIG strategy shapes the labels as GFD's does.
func TestLabelsForMIGStrategy(t *testing.T) {
	uniform := collected(t, collect.SimOptions{System: "dgx-a100", GPUs: intPtr(2), MIG: "1g.5gb:7"})
	mixed := collected(t, collect.SimOptions{System: "dgx-a100", GPUs: intPtr(2), MIG: "3g.20gb:1,1g.5gb:4"})
	// MIG on the first GPU only (a layout half applied, or applied to one).
	partial := collected(t, collect.SimOptions{System: "dgx-a100", GPUs: intPtr(2), MIG: "1g.5gb:7"})
	partial.GPUs[1].MIG = &gpuv1alpha1.MIGStatus{Capable: true, CurrentMode: gpuv1alpha1.MIGDisabled}
	// MIG mode on with no MIG devices yet (all-enabled, or a layout being
	// applied): on the first GPU only, and on both.
	emptyPartial := collected(t, collect.SimOptions{System: "dgx-a100", GPUs: intPtr(2)})
	emptyPartial.GPUs[0].MIG = &gpuv1alpha1.MIGStatus{Capable: true, CurrentMode: gpuv1alpha1.MIGEnabled}
	emptyAll := collected(t, collect.SimOptions{System: "dgx-a100", GPUs: intPtr(2)})
	for i := range emptyAll.GPUs {
		emptyAll.GPUs[i].MIG = &gpuv1alpha1.MIGStatus{Capable: true, CurrentMode: gpuv1alpha1.MIGEnabled}
	}
	// A media-extension profile: the device plugin's resource, and so
	// GFD's label, is nvidia.com/mig-1g.10gb.me.
	media := collected(t, collect.SimOptions{System: "dgx-a100", GPUs: intPtr(1)})
	media.GPUs[0].MIG = &gpuv1alpha1.MIGStatus{Capable: true, CurrentMode: gpuv1alpha1.MIGEnabled,
		Devices: []gpuv1alpha1.MIGDevice{{Profile: "1g.10gb+me", MemoryMiB: 9856}}}
	tests := []struct {
		name     string
		st       gpuv1alpha1.GPUNodeStatus
		strategy string
		want     map[string]string
		absent   []string
	}{
		{"single, one profile: MIG devices stand in for GPUs", uniform, "single",
			map[string]string{gpuv1alpha1.LabelMIGStrategy: "single", gpuv1alpha1.LabelProduct: "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", gpuv1alpha1.LabelCount: "14", gpuv1alpha1.LabelMemory: "4864"},
			[]string{"nvidia.com/mig-1g.5gb.count"}},
		{"single, mixed profiles: invalid, nothing schedulable", mixed, "single",
			map[string]string{gpuv1alpha1.LabelMIGStrategy: "single", gpuv1alpha1.LabelProduct: "NVIDIA-A100-SXM4-40GB-MIG-INVALID", gpuv1alpha1.LabelCount: "0"},
			[]string{"nvidia.com/mig-1g.5gb.count"}},
		{"single, MIG on some GPUs only: invalid, nothing schedulable", partial, "single",
			map[string]string{gpuv1alpha1.LabelMIGStrategy: "single", gpuv1alpha1.LabelProduct: "NVIDIA-A100-SXM4-40GB-MIG-INVALID", gpuv1alpha1.LabelCount: "0"},
			nil},
		{"single, MIG on one GPU with no devices yet: invalid, nothing schedulable", emptyPartial, "single",
			map[string]string{gpuv1alpha1.LabelMIGStrategy: "single", gpuv1alpha1.LabelProduct: "NVIDIA-A100-SXM4-40GB-MIG-INVALID", gpuv1alpha1.LabelCount: "0"},
			nil},
		{"single, MIG on every GPU, no devices: invalid, nothing schedulable", emptyAll, "single",
			map[string]string{gpuv1alpha1.LabelMIGStrategy: "single", gpuv1alpha1.LabelProduct: "NVIDIA-A100-SXM4-40GB-MIG-INVALID", gpuv1alpha1.LabelCount: "0"},
			nil},
		{"mixed", mixed, "mixed",
			map[string]string{gpuv1alpha1.LabelMIGStrategy: "mixed", gpuv1alpha1.LabelCount: "2", "nvidia.com/mig-3g.20gb.count": "2", "nvidia.com/mig-1g.5gb.count": "8"}, nil},
		{"mixed, a media-extension profile: named as its resource", media, "mixed",
			map[string]string{"nvidia.com/mig-1g.10gb.me.count": "1", "nvidia.com/mig-1g.10gb.me.memory": "9856"},
			[]string{"nvidia.com/mig-1g.10gb-me.count"}},
		{"none: MIG devices not advertised", mixed, "none",
			map[string]string{gpuv1alpha1.LabelMIGStrategy: "none", gpuv1alpha1.LabelCount: "2", gpuv1alpha1.LabelProduct: "NVIDIA-A100-SXM4-40GB"},
			[]string{"nvidia.com/mig-3g.20gb.count", "nvidia.com/mig-1g.5gb.count"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := LabelsFor(tt.st, tt.strategy)
			assertValid(t, got)
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
			for _, k := range tt.absent {
				if _, ok := got[k]; ok {
					t.Errorf("%s set: %q", k, got[k])
				}
			}
		})
	}
}

// MIG profiles a GPUNode reports that make one label (1g.10gb+me and
// 1g.10gb.me; two long ones alike in their first 52 characters) add up,
// the first by name giving the memory: the labels do not follow the map's
// order, so the node is not relabelled on every pass.
func TestMixedMIGLabelsOfProfilesThatMakeOneLabel(t *testing.T) {
	long := strings.Repeat("7g.80gb", 8)
	dev := func(profile string, mem int64) gpuv1alpha1.MIGDevice {
		return gpuv1alpha1.MIGDevice{Profile: profile, MemoryMiB: mem}
	}
	st := gpuv1alpha1.GPUNodeStatus{GPUs: []gpuv1alpha1.GPU{{Product: "NVIDIA A100", MIG: &gpuv1alpha1.MIGStatus{Capable: true, CurrentMode: gpuv1alpha1.MIGEnabled,
		Devices: []gpuv1alpha1.MIGDevice{dev("1g.10gb+me", 9856), dev("1g.10gb.me", 1), dev("1g.10gb.me", 1), dev(long+"-a", 80), dev(long+"-b", 81), dev("2g.20gb", 19968)}}}}}
	first := LabelsFor(st, "mixed")
	p := gpuv1alpha1.LabelPrefix + "mig-"
	for k, want := range map[string]string{p + "1g.10gb.me.count": "3", p + "1g.10gb.me.memory": "9856", p + "2g.20gb.count": "1",
		p + LabelValue(long[:52]) + ".count": "2", p + LabelValue(long[:52]) + ".memory": "80"} {
		if first[k] != want {
			t.Errorf("%s = %q, want %q", k, first[k], want)
		}
	}
	for range 50 {
		if got := LabelsFor(st, "mixed"); !maps.Equal(got, first) {
			t.Fatalf("labels changed between passes:\n%v\n%v", first, got)
		}
	}
}

// A product long enough that <product>-MIG-<profile> passes a label
// value's 63 characters keeps its suffix whole, the product cut instead:
// the suffix is what tells a MIG or an invalid MIG node from a plain one.
func TestMIGProductKeepsItsSuffix(t *testing.T) {
	long := "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition" // 55 characters
	uniform := collected(t, collect.SimOptions{System: "dgx-a100", GPUs: intPtr(2), MIG: "1g.5gb:7"})
	mixed := collected(t, collect.SimOptions{System: "dgx-a100", GPUs: intPtr(2), MIG: "3g.20gb:1,1g.5gb:4"})
	for _, st := range []*gpuv1alpha1.GPUNodeStatus{&uniform, &mixed} {
		for i := range st.GPUs {
			st.GPUs[i].Product = long
		}
	}
	for _, tt := range []struct {
		name string
		st   gpuv1alpha1.GPUNodeStatus
		want string
	}{
		{"one profile", uniform, "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edit-MIG-1g.5gb"},
		{"invalid", mixed, "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edi-MIG-INVALID"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := LabelsFor(tt.st, "single")[gpuv1alpha1.LabelProduct]
			if got != tt.want {
				t.Errorf("product = %q (%d characters), want %q", got, len(got), tt.want)
			}
			if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
				t.Errorf("%q: %v", got, errs)
			}
		})
	}
}
