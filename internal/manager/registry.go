package manager

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"
)

// SetupFunc registers one controller with the manager. It receives the
// manager's options so that controllers can read the settings that concern
// them (namespace, default gang scheduler, ...).
type SetupFunc func(ctx context.Context, mgr ctrl.Manager, opts Options) error

// Registry maps controller names to their setup functions. cmd/manager fills
// it; the manager runs the entries that --controllers selects.
type Registry struct {
	setups map[string]SetupFunc
	offs   map[string]SetupFunc
}

// Add registers a controller. Adding a name twice is a programming error.
func (r *Registry) Add(name string, setup SetupFunc) {
	if r.setups == nil {
		r.setups = map[string]SetupFunc{}
	}
	if _, dup := r.setups[name]; dup {
		panic(fmt.Sprintf("controller %q registered twice", name))
	}
	r.setups[name] = setup
}

// AddOff registers what the manager does for a registered controller that
// --controllers leaves out: take away what the controller wrote that only
// it would keep or remove (its setup is not called then).
func (r *Registry) AddOff(name string, off SetupFunc) {
	if r.offs == nil {
		r.offs = map[string]SetupFunc{}
	}
	r.offs[name] = off
}

// Names returns the registered controller names, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.setups))
	for n := range r.setups {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Select resolves a --controllers value: empty, "*" or "all" select every
// controller; otherwise a comma-separated list of names, each of which must be
// registered.
func (r *Registry) Select(spec string) ([]string, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "*" || spec == "all" {
		return r.Names(), nil
	}
	var selected, unknown []string
	seen := map[string]bool{}
	for _, n := range strings.Split(spec, ",") {
		n = strings.TrimSpace(n)
		if n == "" || seen[n] {
			continue
		}
		seen[n] = true
		if _, ok := r.setups[n]; !ok {
			unknown = append(unknown, n)
			continue
		}
		selected = append(selected, n)
	}
	if len(unknown) > 0 {
		valid := "valid names: " + strings.Join(r.Names(), ", ") + ` (or "all")`
		if len(r.setups) == 0 {
			valid = "no controllers are built into this binary"
		}
		return nil, fmt.Errorf("unknown controller(s) %s in --controllers; %s", strings.Join(quote(unknown), ", "), valid)
	}
	sort.Strings(selected)
	return selected, nil
}

func (r *Registry) setup(name string) SetupFunc { return r.setups[name] }

// unselected are the off functions of the controllers not in selected.
func (r *Registry) unselected(selected []string) map[string]SetupFunc {
	out := map[string]SetupFunc{}
	for name, off := range r.offs {
		if !slices.Contains(selected, name) {
			out[name] = off
		}
	}
	return out
}

func quote(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}
