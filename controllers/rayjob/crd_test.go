package rayjob

import (
	"os"
	"testing"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// The embedded pack is KubeRay's RayJob CRD as make manifests copied it,
// with its precomputed hash: a stale one would re-apply the CRD at every
// start, or never.
func TestEmbeddedCRDIsKubeRays(t *testing.T) {
	source, err := os.ReadFile("../../config/crd/external/ray.io_rayjobs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := crdinstall.Verify(crd, source); err != nil {
		t.Fatal(err)
	}
}
