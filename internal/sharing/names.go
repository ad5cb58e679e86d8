package sharing

import (
	"slices"
	"strings"
)

// migResourcePrefix starts the device plugin's MIG resources under the
// mixed strategy: nvidia.com/mig-1g.10gb, nvidia.com/mig-3g.40gb, …
const migResourcePrefix = ResourcePrefix + "mig-"

// sharedSuffix ends a shared resource renamed by renameByDefault:
// nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb.shared.
const sharedSuffix = ".shared"

// Names are the resources the device plugin advertises GPUs under:
// nvidia.com/gpu, each nvidia.com/mig-<profile>, their renameByDefault
// forms <name>.shared, and every rename the cluster's sharing configs give
// (rename: nvidia.com/small). The zero value knows no renames.
type Names struct {
	renamed []string // sorted
}

// NamesOf is the names of src's configs: the inline time-slicing's, and
// every key of the ConfigMap that parses (a key no node uses still names a
// resource some pod may ask for; one that does not parse advertises
// nothing).
func NamesOf(src Source) Names {
	var configs []*Config
	switch p := src.Policy; {
	case p == nil:
	case p.TimeSlicing != nil:
		configs = append(configs, inline(p.TimeSlicing))
	case p.ConfigMapName != "":
		for _, data := range src.Data {
			if c, err := Parse([]byte(data)); err == nil {
				configs = append(configs, c)
			}
		}
	}
	var out Names
	for _, c := range configs {
		for _, s := range []*Replicated{c.Sharing.TimeSlicing, c.Sharing.MPS} {
			if s == nil {
				continue
			}
			for _, r := range s.Resources {
				if r.Rename != "" && !builtIn(r.Rename) && !slices.Contains(out.renamed, r.Rename) {
					out.renamed = append(out.renamed, r.Rename)
				}
			}
		}
	}
	slices.Sort(out.renamed)
	return out
}

// IsGPU says whether name is a resource the device plugin advertises GPUs
// (whole, MIG devices, or their shared replicas) under. Every decision
// "does this pod use GPUs", "is this a GPU resource of the node" goes
// through it.
func (n Names) IsGPU(name string) bool {
	if builtIn(name) {
		return true
	}
	_, found := slices.BinarySearch(n.renamed, name)
	return found
}

// Equal says whether n and o are the same names.
func (n Names) Equal(o Names) bool { return slices.Equal(n.renamed, o.renamed) }

// builtIn: nvidia.com/gpu, nvidia.com/mig-<profile> and their .shared forms.
func builtIn(name string) bool {
	s := strings.TrimSuffix(name, sharedSuffix)
	return s == GPUResource || (strings.HasPrefix(s, migResourcePrefix) && len(s) > len(migResourcePrefix))
}

// IsMIG says whether name is a MIG profile's resource (or its .shared
// form), and which profile (as the resource writes it: 1g.10gb).
func IsMIG(name string) (profile string, ok bool) {
	s := strings.TrimSuffix(name, sharedSuffix)
	if !strings.HasPrefix(s, migResourcePrefix) || len(s) == len(migResourcePrefix) {
		return "", false
	}
	return strings.TrimPrefix(s, migResourcePrefix), true
}
