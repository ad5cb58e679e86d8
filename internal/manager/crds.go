package manager

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// Loom's CRDs carry the version and content hash of the build that applied
// them.
const (
	AnnotationCRDVersion = "loom.dev/crd-version"
	AnnotationCRDHash    = crdinstall.AnnotationHash
	// CRDFieldOwner is the field manager the manager applies its CRDs as.
	CRDFieldOwner = "loom-crds"
)

// CRDNames are Loom's own CRDs (the chart's crds/), the only CRDs the
// chart lets the manager patch.
var CRDNames = []string{"clusterpolicies.gpu.loom.dev", "gpunodes.gpu.loom.dev", "trainingjobs.training.loom.dev"}

// EnsureCRDs brings Loom's CRDs up to this build's: Helm installs a chart's
// crds/ once and never upgrades them, so a new field would be pruned
// silently. Each CRD the cluster lacks, or whose loom.dev/crd-hash differs
// from this build's, is applied server-side (the TrainingJob CRD is past
// client-side apply's annotation limit), unless its loom.dev/crd-version is
// a newer release than this one (an older replica during a rolling upgrade
// leaves the newer CRDs alone). It returns the names it applied.
//
// Only the installed CRDs' metadata is read, and compared with hashes
// computed when the manifests were packed; an embedded manifest is
// unpacked only to be applied (crdinstall.Apply): a start against
// up-to-date CRDs reads a few kilobytes and touches none of the packs.
func EnsureCRDs(ctx context.Context, cfg *rest.Config, c client.Client, build string, log logr.Logger) ([]string, error) {
	crds, err := embeddedCRDs()
	if err != nil {
		return nil, fmt.Errorf("embedded CRDs: %w", err)
	}
	var applied []string
	for _, crd := range crds {
		ann := map[string]string{AnnotationCRDVersion: build, AnnotationCRDHash: crd.ManifestHash}
		have, err := crdinstall.ReadMetadata(ctx, c, crd.Name)
		if err != nil {
			return applied, err
		}
		if have != nil {
			if apply, why := crdNeedsApply(have.GetAnnotations(), ann); !apply {
				log.V(1).Info("CRD left as it is", "crd", crd.Name, "why", why)
				continue
			}
		}
		if crd.Packed, err = packedCRDs.ReadFile(path.Join("crds", crd.file)); err != nil {
			return applied, fmt.Errorf("embedded CRD %s: %w", crd.Name, err)
		}
		if err := crdinstall.Apply(ctx, c, crd.CRD, ann); err != nil {
			return applied, err
		}
		var previous string
		if have != nil {
			previous = have.GetAnnotations()[AnnotationCRDVersion]
		}
		log.Info("applied CRD", "crd", crd.Name, "version", build, "previous", previous)
		applied = append(applied, crd.Name)
	}
	return applied, crdinstall.WaitEstablished(ctx, cfg, applied...)
}

// packedCRDs are the chart's CRDs (crds/) as make manifests packs them
// (hack/crdpack), one <group>_<plural>.json.gz each.
//
//go:embed crds/*.json.gz
var packedCRDs embed.FS

// embeddedCRD is one of packedCRDs, its pack not yet read.
type embeddedCRD struct {
	crdinstall.CRD
	file string
}

// embeddedCRDs are Loom's CRDs, sorted by file name, each named from its
// file name (controller-gen writes <group>_<plural>.yaml) and with its
// precomputed hash, so that neither reads the pack.
func embeddedCRDs() ([]embeddedCRD, error) {
	files, err := fs.Glob(packedCRDs, "crds/*.json.gz")
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	out := make([]embeddedCRD, 0, len(files))
	for _, f := range files {
		base := strings.TrimSuffix(path.Base(f), ".json.gz")
		group, plural, ok := strings.Cut(base, "_")
		if !ok {
			return nil, fmt.Errorf("%s: not named <group>_<plural>.json.gz", f)
		}
		hash, ok := crdHashes[base]
		if !ok {
			return nil, fmt.Errorf("%s has no precomputed hash: run make manifests", f)
		}
		out = append(out, embeddedCRD{
			CRD:  crdinstall.CRD{Name: plural + "." + group, ManifestHash: hash, FieldOwner: CRDFieldOwner},
			file: path.Base(f),
		})
	}
	return out, nil
}

// crdNeedsApply decides from the installed CRD's annotations and the
// build's whether to apply: not when the content is the build's, nor when a
// newer release applied it.
func crdNeedsApply(have, want map[string]string) (bool, string) {
	if have[AnnotationCRDHash] == want[AnnotationCRDHash] {
		return false, "up to date"
	}
	hv, herr := version.ParseSemantic(have[AnnotationCRDVersion])
	wv, werr := version.ParseSemantic(want[AnnotationCRDVersion])
	if herr == nil && werr == nil && hv.GreaterThan(wv) {
		return false, "applied by the newer release " + hv.String()
	}
	return true, ""
}
