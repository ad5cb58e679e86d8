// Package sharing reads the NVIDIA device plugin's config file, the part
// that shares GPUs (time-slicing, MPS), and says for one node how each
// resource is advertised under it: how many replicas of each device, under
// which name, with which strategy. GPU feature discovery's sharing labels
// and a simulated device plugin's allocatable both come from here, so they
// cannot disagree.
package sharing

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Strategy is how a resource's devices are shared, as GFD's
// nvidia.com/gpu.sharing-strategy label names it.
type Strategy string

const (
	StrategyNone        Strategy = "none"
	StrategyTimeSlicing Strategy = "time-slicing"
	StrategyMPS         Strategy = "mps"
)

// ResourcePrefix is the prefix of every resource the device plugin
// advertises; a name without it gets it, as in the device plugin.
const ResourcePrefix = "nvidia.com/"

// GPUResource is the full-GPU resource.
const GPUResource = "nvidia.com/gpu"

// MaxReplicas bounds the replicas of one device: beyond it a config is
// rejected rather than advertised (the device plugin would create that many
// devices per GPU).
const MaxReplicas = 1 << 16

// Config is a device plugin config file (version v1). Only the sharing part
// is interpreted; flags, resources and imex are the device plugin's own and
// are accepted as they are.
type Config struct {
	Version   string          `json:"version"`
	Flags     json.RawMessage `json:"flags,omitempty"`
	Resources json.RawMessage `json:"resources,omitempty"`
	Imex      json.RawMessage `json:"imex,omitempty"`
	Sharing   Sharing         `json:"sharing,omitempty"`
}

// Sharing is the config's sharing section: at most one of time-slicing and
// MPS.
type Sharing struct {
	TimeSlicing *Replicated `json:"timeSlicing,omitempty"`
	MPS         *Replicated `json:"mps,omitempty"`
}

// Replicated is a time-slicing or MPS section.
type Replicated struct {
	// RenameByDefault advertises every shared resource without its own
	// rename as <name>.shared.
	RenameByDefault            bool                 `json:"renameByDefault,omitempty"`
	FailRequestsGreaterThanOne bool                 `json:"failRequestsGreaterThanOne,omitempty"`
	Resources                  []ReplicatedResource `json:"resources"`
}

// ReplicatedResource shares the devices of one resource.
type ReplicatedResource struct {
	Name     string  `json:"name"`
	Rename   string  `json:"rename,omitempty"`
	Devices  Devices `json:"devices,omitempty"`
	Replicas int     `json:"replicas"`
}

// Devices says which devices of a resource are replicated: all (the
// default), the first Count, or those in List (GPU indexes, MIG indexes
// "gpu:mig", or UUIDs).
type Devices struct {
	All   bool
	Count int
	List  []string
}

var (
	uuidPattern     = `[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`
	deviceRefRegexp = regexp.MustCompile(`^([0-9]+|[0-9]+:[0-9]+|GPU-` + uuidPattern + `|MIG-` + uuidPattern +
		`|MIG-GPU-` + uuidPattern + `/[0-9]+/[0-9]+)$`)
)

// UnmarshalJSON reads "all", a count > 0, or a list of device references.
func (d *Devices) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*d = Devices{All: true}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		if s != "all" {
			return fmt.Errorf("devices %q: the only string allowed is \"all\"", s)
		}
		*d = Devices{All: true}
		return nil
	}
	var n int
	if err := json.Unmarshal(b, &n); err == nil {
		if n <= 0 {
			return fmt.Errorf("devices %d: a count of devices must be > 0", n)
		}
		*d = Devices{Count: n}
		return nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("devices must be \"all\", a count or a list, not %s", b)
	}
	list := make([]string, 0, len(raw))
	for _, r := range raw {
		var i uint
		if err := json.Unmarshal(r, &i); err == nil {
			list = append(list, strconv.FormatUint(uint64(i), 10))
			continue
		}
		var ref string
		if err := json.Unmarshal(r, &ref); err != nil || !deviceRefRegexp.MatchString(ref) {
			return fmt.Errorf("devices entry %s: want a GPU index, a MIG index (gpu:mig) or a GPU or MIG UUID", r)
		}
		list = append(list, ref)
	}
	if len(list) == 0 {
		return errors.New("devices: an empty list replicates nothing")
	}
	*d = Devices{List: list}
	return nil
}

// MarshalJSON writes the form UnmarshalJSON reads.
func (d Devices) MarshalJSON() ([]byte, error) {
	switch {
	case d.Count > 0:
		return json.Marshal(d.Count)
	case len(d.List) > 0:
		return json.Marshal(d.List)
	}
	return json.Marshal("all")
}

// Parse reads a device plugin config file strictly: unknown fields,
// duplicate keys, a version other than v1, both time-slicing and MPS, a
// resource without replicas (or fewer than 2), a name outside nvidia.com/
// and a resource listed twice are errors. Resource names are normalised to
// nvidia.com/<name>, and renameByDefault is resolved into each resource's
// Rename.
func Parse(data []byte) (*Config, error) {
	c := &Config{}
	if err := yaml.UnmarshalStrict(data, c); err != nil {
		return nil, err
	}
	if c.Version != "v1" {
		return nil, fmt.Errorf("version %q: only v1 is supported", c.Version)
	}
	if c.Sharing.TimeSlicing != nil && c.Sharing.MPS != nil {
		return nil, errors.New("sharing: set either timeSlicing or mps, not both")
	}
	for _, s := range []struct {
		field string
		r     *Replicated
	}{{"sharing.timeSlicing", c.Sharing.TimeSlicing}, {"sharing.mps", c.Sharing.MPS}} {
		if s.r == nil {
			continue
		}
		if err := s.r.normalise(); err != nil {
			return nil, fmt.Errorf("%s: %w", s.field, err)
		}
	}
	return c, nil
}

// normalise validates the section and resolves names and renames.
func (r *Replicated) normalise() error {
	if len(r.Resources) == 0 {
		return errors.New("no resources specified")
	}
	seen := map[string]bool{}
	for i := range r.Resources {
		res := &r.Resources[i]
		name, err := resourceName(res.Name)
		if err != nil {
			return fmt.Errorf("resources[%d].name: %w", i, err)
		}
		if seen[name] {
			return fmt.Errorf("resources[%d]: %s is listed twice", i, name)
		}
		seen[name] = true
		res.Name = name
		switch {
		case res.Replicas < 2:
			return fmt.Errorf("resources[%d] (%s): replicas must be >= 2, not %d", i, name, res.Replicas)
		case res.Replicas > MaxReplicas:
			return fmt.Errorf("resources[%d] (%s): replicas must be at most %d, not %d", i, name, MaxReplicas, res.Replicas)
		}
		if res.Rename != "" {
			if res.Rename, err = resourceName(res.Rename); err != nil {
				return fmt.Errorf("resources[%d].rename: %w", i, err)
			}
		} else if r.RenameByDefault {
			res.Rename = name + ".shared"
		}
		if res.Devices.Count == 0 && len(res.Devices.List) == 0 {
			res.Devices.All = true
		}
	}
	return nil
}

// resourceName is n as the device plugin advertises it: nvidia.com/<n>.
func resourceName(n string) (string, error) {
	if n == "" {
		return "", errors.New("empty resource name")
	}
	if !strings.HasPrefix(n, ResourcePrefix) {
		if strings.Contains(n, "/") {
			return "", fmt.Errorf("resource %q: only %s resources can be shared", n, ResourcePrefix)
		}
		n = ResourcePrefix + n
	}
	if errs := validation.IsQualifiedName(n); len(errs) > 0 {
		return "", fmt.Errorf("resource %q: %s", n, strings.Join(errs, "; "))
	}
	return n, nil
}
