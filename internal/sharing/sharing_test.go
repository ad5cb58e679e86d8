package sharing

import (
	"errors"
	"maps"
	"strings"
	"testing"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

const timeSlicing4 = `
version: v1
flags:
  migStrategy: none
  plugin:
    deviceListStrategy: envvar
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    map[string]Resource // by the name asked for
		wantErr string
	}{
		{"time-slicing, device plugin flags kept opaque", timeSlicing4,
			map[string]Resource{"nvidia.com/gpu": {Name: GPUResource, Replicas: 4, Strategy: StrategyTimeSlicing, Devices: Devices{All: true}}}, ""},
		{"short names, renameByDefault, explicit rename wins", `
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - {name: gpu, replicas: 2}
    - {name: mig-1g.10gb, replicas: 3, rename: small}
`, map[string]Resource{
			"gpu":                    {Name: GPUResource, Replicas: 2, Strategy: StrategyTimeSlicing, Rename: "nvidia.com/gpu.shared", Devices: Devices{All: true}},
			"nvidia.com/mig-1g.10gb": {Name: "nvidia.com/mig-1g.10gb", Replicas: 3, Strategy: StrategyTimeSlicing, Rename: "nvidia.com/small", Devices: Devices{All: true}},
			"nvidia.com/mig-2g.20gb": {Name: "nvidia.com/mig-2g.20gb", Replicas: 1, Strategy: StrategyNone, Devices: Devices{All: true}},
		}, ""},
		{"mps, devices as a count and a list", `
version: v1
sharing:
  mps:
    resources:
    - {name: nvidia.com/gpu, replicas: 10, devices: 2}
    - {name: nvidia.com/mig-3g.40gb, replicas: 2, devices: [0, "1:0", "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"]}
`, map[string]Resource{
			"nvidia.com/gpu":         {Name: GPUResource, Replicas: 10, Strategy: StrategyMPS, Devices: Devices{Count: 2}},
			"nvidia.com/mig-3g.40gb": {Name: "nvidia.com/mig-3g.40gb", Replicas: 2, Strategy: StrategyMPS, Devices: Devices{List: []string{"0", "1:0", "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"}}},
		}, ""},
		{"no sharing section", "version: v1\nflags: {migStrategy: single}\n",
			map[string]Resource{"nvidia.com/gpu": {Name: GPUResource, Replicas: 1, Strategy: StrategyNone, Devices: Devices{All: true}}}, ""},

		{"not YAML", "version: [v1", nil, "yaml"},
		{"missing version", "sharing: {}\n", nil, `version "": only v1`},
		{"version v2", "version: v2\n", nil, `version "v2"`},
		{"unknown top-level field", "version: v1\nshare: {}\n", nil, `unknown field "share"`},
		{"unknown field in a resource", "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, replica: 3}]}}\n", nil, `unknown field "replica"`},
		{"duplicate key", "version: v1\nversion: v1\n", nil, `key "version" already set`},
		{"both strategies", "version: v1\nsharing:\n  timeSlicing: {resources: [{name: gpu, replicas: 2}]}\n  mps: {resources: [{name: gpu, replicas: 2}]}\n", nil, "either timeSlicing or mps"},
		{"no resources", "version: v1\nsharing: {timeSlicing: {renameByDefault: true}}\n", nil, "sharing.timeSlicing: no resources specified"},
		{"no replicas", "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu}]}}\n", nil, "replicas must be >= 2, not 0"},
		{"one replica", "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}\n", nil, "replicas must be >= 2, not 1"},
		{"replicas as a string", "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: \"4\"}]}}\n", nil, "cannot unmarshal string"},
		{"too many replicas", "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 100000}]}}\n", nil, "at most 65536"},
		{"foreign resource", "version: v1\nsharing: {timeSlicing: {resources: [{name: amd.com/gpu, replicas: 2}]}}\n", nil, "only nvidia.com/ resources"},
		{"invalid resource name", "version: v1\nsharing: {timeSlicing: {resources: [{name: 'gpu!', replicas: 2}]}}\n", nil, `resources[0].name: resource "nvidia.com/gpu!"`},
		{"resource twice", "version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 2}, {name: nvidia.com/gpu, replicas: 3}]}}\n", nil, "listed twice"},
		{"devices: a string other than all", "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: some}]}}\n", nil, `devices "some"`},
		{"devices: zero", "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: 0}]}}\n", nil, "must be > 0"},
		{"devices: a bad reference", "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: [GPU-xyz]}]}}\n", nil, "want a GPU index"},
		{"devices: empty list", "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: []}]}}\n", nil, "empty list"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			n := Node{Config: c}
			for name, want := range tt.want {
				if got := n.Resource(name); !equalResource(got, want) {
					t.Errorf("Resource(%s) = %+v, want %+v", name, got, want)
				}
			}
		})
	}
}

func equalResource(a, b Resource) bool {
	return a.Name == b.Name && a.Replicas == b.Replicas && a.Strategy == b.Strategy && a.Rename == b.Rename &&
		a.Devices.All == b.Devices.All && a.Devices.Count == b.Devices.Count && strings.Join(a.Devices.List, ",") == strings.Join(b.Devices.List, ",")
}

func TestForNode(t *testing.T) {
	cmData := map[string]string{"ts4": timeSlicing4, "plain": "version: v1\n", "broken": "version: v1\nsharing: {timeSlicing: {}}\n"}
	fromCM := func(def string, data map[string]string) Source {
		return Source{Policy: &gpuv1alpha1.DevicePluginConfig{ConfigMapName: "dp", DefaultConfig: def}, Namespace: "loom-system", Data: data}
	}
	label := func(v string) map[string]string { return map[string]string{gpuv1alpha1.LabelDevicePluginConfig: v} }
	tests := []struct {
		name         string
		src          Source
		labels       map[string]string
		wantKey      string
		wantReplicas int
		wantRename   string
		wantErr      string
	}{
		{"no policy config", Source{}, label("ts4"), "", 1, "", ""},
		{"inline time-slicing, every node", Source{Policy: &gpuv1alpha1.DevicePluginConfig{TimeSlicing: &gpuv1alpha1.TimeSlicingSpec{
			RenameByDefault: true, Resources: []gpuv1alpha1.TimeSlicingResource{{Name: "nvidia.com/gpu", Replicas: 8}}}}}, nil, "", 8, "nvidia.com/gpu.shared", ""},
		{"the node's label picks the key", fromCM("plain", cmData), label("ts4"), "ts4", 4, "", ""},
		{"defaultConfig without a label", fromCM("ts4", cmData), nil, "ts4", 4, "", ""},
		{"neither: no config", fromCM("", cmData), nil, "", 1, "", ""},
		{"the label names a missing key", fromCM("ts4", cmData), label("ts9"), "", 0, "", `ConfigMap loom-system/dp, key "ts9": no such key`},
		{"the key does not parse", fromCM("", cmData), label("broken"), "", 0, "", `ConfigMap loom-system/dp, key "broken": sharing.timeSlicing: no resources specified`},
		{"the ConfigMap is missing", fromCM("ts4", nil), nil, "", 0, "", "ConfigMap loom-system/dp: not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := ForNode(tt.src, tt.labels)
			if tt.wantErr != "" {
				var e *Error
				if !errors.As(err, &e) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want an *Error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := n.Resource(GPUResource)
			if n.Key != tt.wantKey || r.Replicas != tt.wantReplicas || r.Rename != tt.wantRename {
				t.Errorf("key %q, replicas %d, rename %q; want %q, %d, %q", n.Key, r.Replicas, r.Rename, tt.wantKey, tt.wantReplicas, tt.wantRename)
			}
		})
	}
}

func TestAllocatable(t *testing.T) {
	tests := []struct {
		name    string
		r       Resource
		devices int
		want    map[string]int64
	}{
		{"not shared", Resource{Name: GPUResource, Replicas: 1}, 8, map[string]int64{GPUResource: 8}},
		{"all devices, same name", Resource{Name: GPUResource, Replicas: 4, Devices: Devices{All: true}}, 8, map[string]int64{GPUResource: 32}},
		{"renamed", Resource{Name: GPUResource, Replicas: 4, Rename: "nvidia.com/gpu.shared", Devices: Devices{All: true}}, 2,
			map[string]int64{"nvidia.com/gpu.shared": 8}},
		{"the first two of eight, renamed", Resource{Name: GPUResource, Replicas: 3, Rename: "nvidia.com/gpu.shared", Devices: Devices{Count: 2}}, 8,
			map[string]int64{"nvidia.com/gpu.shared": 6, GPUResource: 6}},
		{"a count beyond the devices", Resource{Name: GPUResource, Replicas: 2, Devices: Devices{Count: 16}}, 8, map[string]int64{GPUResource: 16}},
		{"a list, one index beyond the devices", Resource{Name: GPUResource, Replicas: 2, Devices: Devices{List: []string{"0", "9"}}}, 2,
			map[string]int64{GPUResource: 3}},
		{"no devices", Resource{Name: GPUResource, Replicas: 4, Devices: Devices{All: true}}, 0, map[string]int64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Allocatable(tt.devices); !maps.Equal(got, tt.want) {
				t.Errorf("Allocatable(%d) = %v, want %v", tt.devices, got, tt.want)
			}
		})
	}
}

// Whatever the ConfigMap holds, Parse returns a config or an error (never
// panics), and a config it returns says every resource is shared at least
// twice and at most MaxReplicas times, under nvidia.com/ names.
func FuzzParse(f *testing.F) {
	f.Add(timeSlicing4)
	f.Add("version: v1\nsharing: {mps: {renameByDefault: true, resources: [{name: gpu, replicas: 2, devices: [0, \"1:2\"]}]}}\n")
	f.Add("version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: null}]}}\n")
	f.Add("{}")
	f.Fuzz(func(t *testing.T, in string) {
		c, err := Parse([]byte(in))
		if err != nil {
			return
		}
		for _, s := range []*Replicated{c.Sharing.TimeSlicing, c.Sharing.MPS} {
			if s == nil {
				continue
			}
			for _, r := range s.Resources {
				got := Node{Config: c}.Resource(r.Name)
				if got.Replicas < 2 || got.Replicas > MaxReplicas || !strings.HasPrefix(got.Name, ResourcePrefix) ||
					(got.Rename != "" && !strings.HasPrefix(got.Rename, ResourcePrefix)) {
					t.Fatalf("accepted %q as %+v", in, got)
				}
				total := int64(0)
				for name, n := range got.Allocatable(8) {
					if n <= 0 || !strings.HasPrefix(name, ResourcePrefix) {
						t.Fatalf("allocatable %s=%d from %q", name, n, in)
					}
					total += n
				}
				if total < 8 {
					t.Fatalf("allocatable %v: fewer than the 8 devices, from %q", got.Allocatable(8), in)
				}
			}
		}
	})
}
