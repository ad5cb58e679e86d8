package sharing

import (
	"testing"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// GPU resources are the device plugin's own names and every rename of the
// policy's configs, inline or in any key of its ConfigMap; nothing else
// under nvidia.com/ (a NIC's device plugin uses it too).
func TestNamesIsGPU(t *testing.T) {
	cm := Source{Policy: &gpuv1alpha1.DevicePluginConfig{ConfigMapName: "dp"}, Namespace: "loom", Data: map[string]string{
		"small":  "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      rename: small\n      replicas: 4\n",
		"mps":    "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/mig-1g.10gb\n      rename: nvidia.com/tiny\n      replicas: 2\n",
		"broken": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      rename: huge\n      replicas: 1\n",
	}}
	inline := Source{Policy: &gpuv1alpha1.DevicePluginConfig{TimeSlicing: &gpuv1alpha1.TimeSlicingSpec{RenameByDefault: true,
		Resources: []gpuv1alpha1.TimeSlicingResource{{Name: "nvidia.com/gpu", Replicas: 4}}}}}
	for _, tc := range []struct {
		src  Source
		name string
		want bool
	}{
		{Source{}, "nvidia.com/gpu", true},
		{Source{}, "nvidia.com/mig-1g.10gb", true},
		{Source{}, "nvidia.com/mig-1g.10gb.me", true},
		{Source{}, "nvidia.com/gpu.shared", true},
		{Source{}, "nvidia.com/mig-", false},
		{Source{}, "nvidia.com/small", false},
		{Source{}, "nvidia.com/rdma_shared_device_a", false},
		{Source{}, "amd.com/gpu", false},
		{cm, "nvidia.com/small", true},
		{cm, "nvidia.com/tiny", true},
		{cm, "nvidia.com/huge", false}, // its key does not parse: nothing advertises it
		{cm, "nvidia.com/rdma_shared_device_a", false},
		{inline, "nvidia.com/gpu.shared", true},
		{inline, "nvidia.com/small", false},
	} {
		if got := NamesOf(tc.src).IsGPU(tc.name); got != tc.want {
			t.Errorf("%v: IsGPU(%s) = %v, want %v", tc.src.Data != nil, tc.name, got, tc.want)
		}
	}
	if !NamesOf(cm).Equal(NamesOf(cm)) || NamesOf(cm).Equal(NamesOf(inline)) {
		t.Error("Equal")
	}
}

// The device plugin refuses a container more than one unit of a resource
// whose units are all replicas, under MPS always and under time-slicing
// with failRequestsGreaterThanOne (its ValidateRequest).
func TestOnePerContainer(t *testing.T) {
	ts := func(flag, res string) string {
		return "version: v1\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: " + flag + "\n    resources:\n" + res
	}
	for _, tc := range []struct {
		name, config, resource string
		want                   Strategy
	}{
		{"time-slicing with the flag", ts("true", "    - name: gpu\n      replicas: 4\n"), "nvidia.com/gpu", StrategyTimeSlicing},
		{"time-slicing without it", ts("false", "    - name: gpu\n      replicas: 4\n"), "nvidia.com/gpu", ""},
		{"renamed: the new name", ts("true", "    - name: gpu\n      rename: small\n      replicas: 4\n"), "nvidia.com/small", StrategyTimeSlicing},
		{"renamed: the old name keeps the whole GPUs", ts("true", "    - name: gpu\n      rename: small\n      devices: 2\n      replicas: 4\n"), "nvidia.com/gpu", ""},
		{"some devices shared under the old name", ts("true", "    - name: gpu\n      devices: 2\n      replicas: 4\n"), "nvidia.com/gpu", ""},
		{"another resource", ts("true", "    - name: mig-1g.10gb\n      replicas: 4\n"), "nvidia.com/gpu", ""},
		{"MPS, whatever the flag", "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 2\n", "nvidia.com/gpu", StrategyMPS},
		{"no sharing", "version: v1\n", "nvidia.com/gpu", ""},
	} {
		c, err := Parse([]byte(tc.config))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, ok := Node{Config: c}.OnePerContainer(tc.resource)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: OnePerContainer(%s) = %q, %v; want %q", tc.name, tc.resource, got, ok, tc.want)
		}
	}
	if _, ok := (Node{}).OnePerContainer("nvidia.com/gpu"); ok {
		t.Error("no config: one per container")
	}
}
