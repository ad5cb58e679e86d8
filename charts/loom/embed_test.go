package chart

import (
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// Each CRD's name, read from its file name, is the manifest's own.
func TestCRDNames(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) == 0 {
		t.Fatal("no CRDs embedded")
	}
	for _, crd := range crds {
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		b, err := crd.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", crd.Name, err)
		}
		if m.Kind != "CustomResourceDefinition" || m.Metadata.Name != crd.Name {
			t.Errorf("file named for %s holds a %s named %q", crd.Name, m.Kind, m.Metadata.Name)
		}
	}
}

// Each CRD's precomputed hash is its manifest's (make manifests writes
// them): a stale one would re-apply the CRD at every start, or never.
func TestCRDHashesCurrent(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds {
		b, err := crd.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if want := crdinstall.Hash(b); crd.Hash != want {
			t.Errorf("%s: precomputed hash %q, manifest's %q: run make manifests", crd.Name, crd.Hash, want)
		}
	}
	if len(crdHashes) != len(crds) {
		t.Errorf("%d precomputed hashes for %d CRDs: run make manifests", len(crdHashes), len(crds))
	}
}
