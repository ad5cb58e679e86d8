package manager

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	chart "github.com/loom-dev/loom/charts/loom"
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
// computed when the manifests were generated; an embedded manifest is read
// and parsed only to be applied: a start against up-to-date CRDs reads a
// few kilobytes and touches none of the embedded YAML.
func EnsureCRDs(ctx context.Context, cfg *rest.Config, c client.Client, build string, log logr.Logger) ([]string, error) {
	crds, err := chart.CRDs()
	if err != nil {
		return nil, fmt.Errorf("embedded CRDs: %w", err)
	}
	var applied []string
	for _, crd := range crds {
		ann := map[string]string{AnnotationCRDVersion: build, AnnotationCRDHash: crd.Hash}
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
		manifest, err := crd.Manifest()
		if err != nil {
			return applied, fmt.Errorf("embedded CRD %s: %w", crd.Name, err)
		}
		want, err := crdinstall.Desired(manifest, crd.Name, ann)
		if err != nil {
			return applied, err
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(want), client.FieldOwner(CRDFieldOwner), client.ForceOwnership); err != nil {
			return applied, fmt.Errorf("applying CRD %s: %w", crd.Name, err)
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
