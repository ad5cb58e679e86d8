package manager

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// Each embedded pack is the chart's CRD of the same file name (make
// manifests packs charts/loom/crds), a CRD of the name its file name gives,
// with its precomputed hash: a stale pack would install an older schema
// than the chart's, a stale hash re-apply the CRD at every start, or never.
func TestEmbeddedCRDsAreTheChartsCRDs(t *testing.T) {
	crds, err := embeddedCRDs()
	if err != nil {
		t.Fatal(err)
	}
	charts, err := filepath.Glob("../../charts/loom/crds/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) == 0 || len(crds) != len(charts) || len(crdHashes) != len(crds) {
		t.Fatalf("%d packs, %d precomputed hashes, %d chart CRDs: run make manifests", len(crds), len(crdHashes), len(charts))
	}
	for i, crd := range crds {
		if want := strings.TrimSuffix(filepath.Base(charts[i]), ".yaml") + ".json.gz"; crd.file != want {
			t.Fatalf("pack %s beside chart CRD %s: run make manifests", crd.file, charts[i])
		}
		if crd.Packed, err = packedCRDs.ReadFile("crds/" + crd.file); err != nil {
			t.Fatal(err)
		}
		source, err := os.ReadFile(charts[i])
		if err != nil {
			t.Fatal(err)
		}
		if err := crdinstall.Verify(crd.CRD, source); err != nil {
			t.Errorf("%s: %v", crd.file, err)
		}
	}
}
