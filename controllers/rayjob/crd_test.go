package rayjob

import (
	"testing"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// The precomputed hash is the embedded manifest's (make manifests writes
// it): a stale one would re-apply the CRD at every start, or never.
func TestCRDHashCurrent(t *testing.T) {
	if want := crdinstall.Hash(rayJobCRD); crd.ManifestHash != want {
		t.Errorf("precomputed hash %q, manifest's %q: run make manifests", crd.ManifestHash, want)
	}
}
