// Package chart embeds the Helm chart's CRDs, which the manager applies at
// start (internal/manager EnsureCRDs): Helm installs crds/ but never
// upgrades them. (.helmignore keeps this file out of the packaged chart.)
package chart

import (
	"embed"
	"io/fs"
	"sort"
)

//go:embed crds/*.yaml
var crds embed.FS

// CRDs returns the chart's CRD manifests (one CRD a file), sorted by file
// name.
func CRDs() ([][]byte, error) {
	names, err := fs.Glob(crds, "crds/*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([][]byte, 0, len(names))
	for _, n := range names {
		b, err := crds.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}
