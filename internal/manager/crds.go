package manager

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	chart "github.com/loom-dev/loom/charts/loom"
)

// Loom's CRDs carry the version and content hash of the build that applied
// them.
const (
	AnnotationCRDVersion = "loom.dev/crd-version"
	AnnotationCRDHash    = "loom.dev/crd-hash"
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
// Only the installed CRDs' metadata is read, and an embedded manifest is
// parsed only to be applied: a start against up-to-date CRDs reads a few
// kilobytes and parses nothing.
func EnsureCRDs(ctx context.Context, c client.Client, build string, log logr.Logger) ([]string, error) {
	crds, err := chart.CRDs()
	if err != nil {
		return nil, fmt.Errorf("embedded CRDs: %w", err)
	}
	var applied []string
	for _, crd := range crds {
		ann := map[string]string{AnnotationCRDVersion: build, AnnotationCRDHash: contentHash(crd.Manifest)}
		have := &metav1.PartialObjectMetadata{}
		have.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		err = c.Get(ctx, client.ObjectKey{Name: crd.Name}, have)
		if err != nil && !apierrors.IsNotFound(err) {
			return applied, fmt.Errorf("reading CRD %s: %w", crd.Name, err)
		}
		if err == nil {
			if apply, why := crdNeedsApply(have.GetAnnotations(), ann); !apply {
				log.V(1).Info("CRD left as it is", "crd", crd.Name, "why", why)
				continue
			}
		}
		want, err := desiredCRD(crd, ann)
		if err != nil {
			return applied, err
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(want), client.FieldOwner(CRDFieldOwner), client.ForceOwnership); err != nil {
			return applied, fmt.Errorf("applying CRD %s: %w", crd.Name, err)
		}
		log.Info("applied CRD", "crd", crd.Name, "version", build, "previous", have.GetAnnotations()[AnnotationCRDVersion])
		applied = append(applied, crd.Name)
	}
	return applied, waitEstablished(ctx, c, applied)
}

// contentHash is a manifest's loom.dev/crd-hash.
func contentHash(manifest []byte) string {
	sum := sha256.Sum256(manifest)
	return hex.EncodeToString(sum[:8])
}

// desiredCRD is one embedded CRD with the build's annotations ann.
func desiredCRD(crd chart.CRD, ann map[string]string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(crd.Manifest, &u.Object); err != nil {
		return nil, fmt.Errorf("embedded CRD %s: %w", crd.Name, err)
	}
	if u.GetName() != crd.Name {
		return nil, fmt.Errorf("embedded CRD is %q, want %q (its file name)", u.GetName(), crd.Name)
	}
	all := u.GetAnnotations()
	if all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, ann)
	u.SetAnnotations(all)
	return u, nil
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

// waitEstablished waits until every named CRD is Established, so that the
// controllers' informers find their kinds served.
func waitEstablished(ctx context.Context, c client.Client, names []string) error {
	for _, name := range names {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			u := &unstructured.Unstructured{}
			u.SetAPIVersion("apiextensions.k8s.io/v1")
			u.SetKind("CustomResourceDefinition")
			if err := c.Get(ctx, client.ObjectKey{Name: name}, u); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, cond := range conds {
				m, _ := cond.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	return nil
}
