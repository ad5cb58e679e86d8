package crdinstall

import "testing"

// A CRD's hash is the one computed when its manifest was copied, else its
// manifest's.
func TestCRDHash(t *testing.T) {
	m := []byte("kind: CustomResourceDefinition\n")
	if got, want := (CRD{Manifest: m}).Hash(), Hash(m); got != want || len(got) != 16 {
		t.Errorf("without a precomputed hash: %q, want %q (16 hex digits)", got, want)
	}
	if got := (CRD{Manifest: m, ManifestHash: "0123456789abcdef"}).Hash(); got != "0123456789abcdef" {
		t.Errorf("with a precomputed hash: %q, want it", got)
	}
}
