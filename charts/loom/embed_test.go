package chart

import (
	"testing"

	"sigs.k8s.io/yaml"
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
		if err := yaml.Unmarshal(crd.Manifest, &m); err != nil {
			t.Fatalf("%s: %v", crd.Name, err)
		}
		if m.Kind != "CustomResourceDefinition" || m.Metadata.Name != crd.Name {
			t.Errorf("file named for %s holds a %s named %q", crd.Name, m.Kind, m.Metadata.Name)
		}
	}
}
