package migparted

import (
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func mustParse(t *testing.T, s string) *Config {
	t.Helper()
	c, err := Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestParseRejects(t *testing.T) {
	tests := []struct{ name, config, wantErr string }{
		{"not yaml", "version: [", "mig-parted config"},
		{"wrong version", "version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", `version "v2", want "v1"`},
		{"no version", "mig-configs: {a: [{devices: all, mig-enabled: false}]}", `version ""`},
		{"no layouts", "version: v1\nmig-configs: {}", "holds no layout"},
		{"unknown field", "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-devicez: {}}]}", "mig-devicez"},
		{"unknown top field", "version: v1\nextra: 1\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", "extra"},
		{"duplicate layout", "version: v1\nmig-configs:\n  a: [{devices: all, mig-enabled: false}]\n  a: [{devices: all, mig-enabled: false}]\n", "a"},
		{"empty layout", "version: v1\nmig-configs: {a: []}", `layout "a": no entries`},
		{"no devices", "version: v1\nmig-configs: {a: [{mig-enabled: false}]}", "devices is required"},
		{"devices some", "version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}", `not "some"`},
		{"negative index", "version: v1\nmig-configs: {a: [{devices: [-1], mig-enabled: false}]}", "index -1"},
		{"repeated index", "version: v1\nmig-configs: {a: [{devices: [0, 0], mig-enabled: false}]}", "index 0"},
		{"bad filter", `version: v1
mig-configs: {a: [{device-filter: "A100", devices: all, mig-enabled: false}]}`, `"A100" is not a PCI device ID`},
		{"filter of numbers", "version: v1\nmig-configs: {a: [{device-filter: {x: 1}, devices: all, mig-enabled: false}]}", "device-filter must be"},
		{"bad profile", `version: v1
mig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {"big": 1}}]}`, `"big" is not a MIG profile`},
		{"too many", `version: v1
mig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 9}}]}`, "9 of 1g.5gb"},
		{"devices with MIG off", `version: v1
mig-configs: {a: [{devices: all, mig-enabled: false, mig-devices: {"1g.5gb": 1}}]}`, "mig-enabled: false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.config))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	c := mustParse(t, `version: v1
mig-configs:
  split:
    - devices: [0]
      device-filter: "0x20B010DE"
      mig-enabled: true
      mig-devices: {"1g.5gb": 7, "2g.10gb": 0}
    - devices: all
      mig-enabled: false
`)
	a100 := func(i int) GPU { return GPU{Index: i, PCIDeviceID: "0x20b0"} }
	tests := []struct {
		name, layout string
		gpus         []GPU
		want         []Result
		wantErr      string
	}{
		{"first entry for GPU 0, second for the rest", "split", []GPU{a100(0), a100(1)},
			[]Result{{Index: 0, MIGEnabled: true, Devices: map[string]int{"1g.5gb": 7}}, {Index: 1}}, ""},
		{"filter not matching falls through", "split", []GPU{{Index: 0, PCIDeviceID: "0x2330"}}, []Result{{Index: 0}}, ""},
		{"no GPUs", "split", nil, []Result{}, ""},
		{"unknown layout", "all-1g.5gb", []GPU{a100(0)}, nil, `unknown MIG layout "all-1g.5gb" (the config has split)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Resolve(c, tt.layout, tt.gpus)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// The built-in layouts give each GPU family GPU Operator's profiles, and
// a layout for another family fails naming the GPU.
func TestDefaultLayouts(t *testing.T) {
	c, err := Parse(Default())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		layout, device string
		want           map[string]int
		wantErr        string
	}{
		{"all-1g.5gb", "0x20B0", map[string]int{"1g.5gb": 7}, ""},
		{"all-7g.40gb", "0x20F1", map[string]int{"7g.40gb": 1}, ""},
		{"all-1g.10gb", "0x20B2", map[string]int{"1g.10gb": 7}, ""},
		{"all-1g.10gb", "0x2330", map[string]int{"1g.10gb": 7}, ""},
		{"all-1g.10gb", "0x20B0", map[string]int{"1g.10gb": 4}, ""},
		{"all-3g.40gb", "0x2331", map[string]int{"3g.40gb": 2}, ""},
		{"all-1g.18gb", "0x2335", map[string]int{"1g.18gb": 7}, ""},
		{"all-7g.141gb", "0x233B", map[string]int{"7g.141gb": 1}, ""},
		{"all-1g.23gb", "0x2901", map[string]int{"1g.23gb": 7}, ""},
		{"all-7g.180gb", "0x2901", map[string]int{"7g.180gb": 1}, ""},
		{"all-balanced", "0x2330", map[string]int{"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, ""},
		{"all-balanced", "0x20B0", map[string]int{"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}, ""},
		{"all-enabled", "0x2330", nil, ""},
		{"all-1g.5gb", "0x20B2", nil, `MIG layout "all-1g.5gb" has no entry for GPU 0 (PCI device 0x20B210DE)`},
		{"all-1g.18gb", "0x2330", nil, "has no entry for GPU 0"},
		{"all-1g.99gb", "0x2330", nil, `unknown MIG layout "all-1g.99gb"`},
	}
	for _, tt := range tests {
		got, err := Resolve(c, tt.layout, []GPU{{Index: 0, PCIDeviceID: tt.device}})
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s on %s: error %v, want %q", tt.layout, tt.device, err, tt.wantErr)
			}
		case err != nil || len(got) != 1 || !got[0].MIGEnabled || !reflect.DeepEqual(got[0].Devices, tt.want):
			t.Errorf("%s on %s: %+v, %v; want %v", tt.layout, tt.device, got, err, tt.want)
		}
	}
	off, err := Resolve(c, "all-disabled", []GPU{{Index: 0, PCIDeviceID: "0x2330"}, {Index: 1, PCIDeviceID: "0x1eb8"}})
	if err != nil || len(off) != 2 || off[0].MIGEnabled || off[1].MIGEnabled {
		t.Errorf("all-disabled: %+v, %v", off, err)
	}
}

func TestNormalizeID(t *testing.T) {
	for in, want := range map[string]string{"0x2330": "0x233010DE", "2330": "0x233010DE", "10de:2330": "0x233010DE",
		"0x233010de": "0x233010DE", " 0x20b0 ": "0x20B010DE", "0x1": "0x000110DE", "garbage": "0xGARBAGE"} {
		if got := NormalizeID(in); got != want {
			t.Errorf("NormalizeID(%q) = %q, want %q", in, got, want)
		}
	}
}

// Parse never panics; what it accepts survives a round trip and resolves
// (or fails with an error) for any GPU without panicking.
func FuzzParse(f *testing.F) {
	f.Add(string(Default()))
	f.Add("version: v1\nmig-configs: {a: [{devices: [0, 2], device-filter: 0x20B010DE, mig-enabled: true, mig-devices: {1g.5gb: 7}}]}")
	f.Add("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false}]}")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse([]byte(s))
		if err != nil {
			return
		}
		b, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		again, err := Parse(b)
		if err != nil || !reflect.DeepEqual(c, again) {
			t.Fatalf("round trip: %v\n%s", err, b)
		}
		for _, l := range c.Layouts() {
			res, err := Resolve(c, l, []GPU{{0, "0x20b0"}, {1, "0x2330"}, {2, "junk"}})
			if err == nil && len(res) != 3 {
				t.Fatalf("%s: %d results for 3 GPUs", l, len(res))
			}
		}
	})
}
