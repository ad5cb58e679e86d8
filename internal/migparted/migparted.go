// Package migparted reads NVIDIA mig-parted configs (the format of the MIG
// manager's config file) and resolves a named layout to what each GPU of a
// node should become.
//
//	version: v1
//	mig-configs:
//	  all-1g.10gb:
//	    - device-filter: ["0x233010DE", "0x20B210DE"]
//	      devices: all
//	      mig-enabled: true
//	      mig-devices:
//	        "1g.10gb": 7
//
// An entry applies to the GPUs its devices name (all, or a list of indices)
// whose PCI device ID (0x<device><vendor>) its device-filter holds (no
// filter: every GPU). Every GPU of the node must be matched by an entry of
// the layout; the first matching entry wins.
package migparted

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Version is the one config version understood.
const Version = "v1"

// Config is a mig-parted config: named layouts.
type Config struct {
	Version    string                  `json:"version"`
	MIGConfigs map[string][]DeviceSpec `json:"mig-configs"`
}

// DeviceSpec is one entry of a layout.
type DeviceSpec struct {
	// DeviceFilter holds PCI device IDs (0x<device><vendor>, e.g.
	// 0x20B010DE); empty matches every GPU. YAML takes one string or a list.
	DeviceFilter Filter `json:"device-filter,omitempty"`
	// Devices are the GPU indices the entry applies to (nil: all).
	Devices Devices `json:"devices"`
	// MIGEnabled turns MIG mode on or off.
	MIGEnabled bool `json:"mig-enabled"`
	// MIGDevices counts the MIG devices to create by profile (1g.10gb).
	MIGDevices map[string]int `json:"mig-devices,omitempty"`
}

// Filter is a device-filter: PCI device IDs.
type Filter []string

// UnmarshalJSON takes one string or a list of strings.
func (f *Filter) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*f = Filter{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("device-filter must be a PCI device ID or a list of them")
	}
	*f = many
	return nil
}

// Devices is "all" (All) or a list of GPU indices.
type Devices struct {
	All     bool
	Indices []int
}

// UnmarshalJSON takes "all" or a list of non-negative integers.
func (d *Devices) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		if s != "all" {
			return fmt.Errorf(`devices must be "all" or a list of GPU indices, not %q`, s)
		}
		*d = Devices{All: true}
		return nil
	}
	var idx []int
	if err := json.Unmarshal(b, &idx); err != nil {
		return fmt.Errorf(`devices must be "all" or a list of GPU indices`)
	}
	*d = Devices{Indices: idx}
	return nil
}

// MarshalJSON writes "all" or the indices.
func (d Devices) MarshalJSON() ([]byte, error) {
	if d.All {
		return []byte(`"all"`), nil
	}
	if d.Indices == nil {
		return []byte(`[]`), nil
	}
	return json.Marshal(d.Indices)
}

var (
	pciIDRE   = regexp.MustCompile(`^0x[0-9A-Fa-f]{8}$`)
	profileRE = regexp.MustCompile(`^([0-9]+c\.)?[0-9]+g\.[0-9]+gb([+-][a-z][a-z.]*)?$`)
)

//go:embed default.yaml
var defaultConfig []byte

// Default is Loom's built-in config: GPU Operator's layouts for A100 (40 and
// 80 GB), H100 80 GB, H200 141 GB and B200, plus all-disabled,
// all-enabled and all-balanced.
func Default() []byte { return bytes.Clone(defaultConfig) }

// Parse reads a config strictly: unknown fields, duplicate keys, a version
// other than v1, an empty layout, malformed device IDs, indices or profiles
// are errors naming the place.
func Parse(data []byte) (*Config, error) {
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("mig-parted config: %w", err)
	}
	if c.Version != Version {
		return nil, fmt.Errorf("mig-parted config: version %q, want %q", c.Version, Version)
	}
	if len(c.MIGConfigs) == 0 {
		return nil, fmt.Errorf("mig-parted config: mig-configs holds no layout")
	}
	for _, name := range c.Layouts() {
		if err := validateLayout(c.MIGConfigs[name]); err != nil {
			return nil, fmt.Errorf("mig-parted config: layout %q: %w", name, err)
		}
		for i := range c.MIGConfigs[name] {
			// {} and [] read as nothing, as when left out.
			s := &c.MIGConfigs[name][i]
			if len(s.MIGDevices) == 0 {
				s.MIGDevices = nil
			}
			if len(s.DeviceFilter) == 0 {
				s.DeviceFilter = nil
			}
		}
	}
	return &c, nil
}

func validateLayout(specs []DeviceSpec) error {
	if len(specs) == 0 {
		return fmt.Errorf("no entries")
	}
	for i, s := range specs {
		if err := validateSpec(s); err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
	}
	return nil
}

func validateSpec(s DeviceSpec) error {
	for _, id := range s.DeviceFilter {
		if !pciIDRE.MatchString(id) {
			return fmt.Errorf("device-filter %q is not a PCI device ID such as 0x20B010DE", id)
		}
	}
	if !s.Devices.All && len(s.Devices.Indices) == 0 {
		return fmt.Errorf(`devices is required: "all" or a list of GPU indices`)
	}
	seen := map[int]bool{}
	for _, i := range s.Devices.Indices {
		if i < 0 || seen[i] {
			return fmt.Errorf("devices: index %d is negative or repeated", i)
		}
		seen[i] = true
	}
	if !s.MIGEnabled && len(s.MIGDevices) > 0 {
		return fmt.Errorf("mig-devices given with mig-enabled: false")
	}
	for _, p := range sortedKeys(s.MIGDevices) {
		if !profileRE.MatchString(p) {
			return fmt.Errorf("mig-devices: %q is not a MIG profile such as 1g.10gb", p)
		}
		if n := s.MIGDevices[p]; n < 0 || n > 8 {
			return fmt.Errorf("mig-devices: %d of %s (0 to 8 per GPU)", n, p)
		}
	}
	return nil
}

// Layouts are the config's layout names, sorted.
func (c *Config) Layouts() []string { return sortedKeys(c.MIGConfigs) }

// GPU is one GPU of a node as Resolve needs it.
type GPU struct {
	Index int
	// PCIDeviceID as the node agent reports it (0x2330) or as mig-parted
	// writes it (0x233010DE); a bare device ID is NVIDIA's (vendor 10de).
	PCIDeviceID string
}

// Result is what one GPU should become.
type Result struct {
	Index      int
	MIGEnabled bool
	// Devices counts the MIG devices by profile (nil with MIG off).
	Devices map[string]int
}

// Resolve is layout applied to the node's GPUs: one Result per GPU, in the
// order given, or an error naming why (the layout does not exist, no entry
// of it matches a GPU).
func Resolve(c *Config, layout string, gpus []GPU) ([]Result, error) {
	specs, ok := c.MIGConfigs[layout]
	if !ok {
		return nil, fmt.Errorf("unknown MIG layout %q (the config has %s)", layout, listNames(c.Layouts()))
	}
	out := make([]Result, 0, len(gpus))
	for _, g := range gpus {
		id := NormalizeID(g.PCIDeviceID)
		i := slices.IndexFunc(specs, func(s DeviceSpec) bool { return s.matches(g.Index, id) })
		if i < 0 {
			return nil, fmt.Errorf("MIG layout %q has no entry for GPU %d (PCI device %s)", layout, g.Index, id)
		}
		r := Result{Index: g.Index, MIGEnabled: specs[i].MIGEnabled}
		for p, n := range specs[i].MIGDevices {
			if n == 0 {
				continue
			}
			if r.Devices == nil {
				r.Devices = map[string]int{}
			}
			r.Devices[p] = n
		}
		out = append(out, r)
	}
	return out, nil
}

func (s DeviceSpec) matches(index int, id string) bool {
	if !s.Devices.All && !slices.Contains(s.Devices.Indices, index) {
		return false
	}
	return len(s.DeviceFilter) == 0 || slices.ContainsFunc(s.DeviceFilter, func(f string) bool { return NormalizeID(f) == id })
}

// NormalizeID writes a PCI device ID as 0x<DEVICE><VENDOR> in upper case:
// 0x2330, 2330, 10de:2330 and 0x233010de are all 0x233010DE.
func NormalizeID(id string) string {
	s := strings.ToUpper(strings.TrimSpace(id))
	vendor := "10DE"
	if v, d, ok := strings.Cut(s, ":"); ok {
		vendor, s = strings.TrimPrefix(v, "0X"), d
	}
	s = strings.TrimPrefix(s, "0X")
	if len(s) <= 4 {
		if _, err := strconv.ParseUint(s, 16, 16); err == nil {
			s = strings.Repeat("0", 4-len(s)) + s + vendor
		}
	}
	return "0x" + s
}

func listNames(names []string) string {
	const most = 8
	if len(names) > most {
		return strings.Join(names[:most], ", ") + fmt.Sprintf(" and %d more", len(names)-most)
	}
	return strings.Join(names, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
