// Package chart embeds the Helm chart's CRDs, which the manager applies at
// start (internal/manager EnsureCRDs): Helm installs crds/ but never
// upgrades them. (.helmignore keeps this file out of the packaged chart.)
package chart

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

//go:embed crds/*.yaml
var crds embed.FS

// CRD is one of the chart's CRDs.
type CRD struct {
	// Name is the CRD's name, <plural>.<group>, read from its file name
	// (controller-gen writes <group>_<plural>.yaml), so that a caller can
	// look the CRD up without parsing the manifest.
	Name string
	// Hash is the manifest's content hash (crdinstall.Hash), computed
	// when the chart's CRDs were generated (hack/crdhash): comparing it
	// with an installed CRD's reads none of the manifest.
	Hash string
	file string
}

// Manifest is the CRD's YAML, read (copied) from the embedded file only
// when asked for: a start that finds the CRD current never is.
func (c CRD) Manifest() ([]byte, error) { return crds.ReadFile(c.file) }

// CRDs returns the chart's CRDs (one a file), sorted by file name.
func CRDs() ([]CRD, error) {
	names, err := fs.Glob(crds, "crds/*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]CRD, 0, len(names))
	for _, n := range names {
		group, plural, ok := strings.Cut(strings.TrimSuffix(path.Base(n), ".yaml"), "_")
		if !ok {
			return nil, fmt.Errorf("%s: not named <group>_<plural>.yaml", n)
		}
		hash, ok := crdHashes[path.Base(n)]
		if !ok {
			return nil, fmt.Errorf("%s has no precomputed hash: run make manifests", n)
		}
		out = append(out, CRD{Name: plural + "." + group, Hash: hash, file: n})
	}
	return out, nil
}
