// Package crdinstall applies a third-party CRD Loom carries (KubeRay's
// RayCluster and RayJob CRDs) when it is absent, upgrades one Loom applied
// before, and leaves one someone else installed alone.
package crdinstall

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/loom-dev/loom/internal/apply"
)

// AnnotationHash is the content hash of the manifest Loom last applied to
// a CRD (the first 8 bytes of its SHA-256, in hex).
const AnnotationHash = "loom.dev/crd-hash"

// CRD is one CRD Loom may install.
type CRD struct {
	// Name is the CRD's name (plural.group).
	Name string
	// Manifest is its YAML, as copied from the module Loom builds against.
	Manifest []byte
	// ManifestHash is Hash(Manifest), computed when the manifest was
	// copied (hack/crdhash), so that a start that finds the CRD current
	// never reads the manifest; empty: computed from Manifest.
	ManifestHash string
	// FieldOwner is the field manager Loom applies it as.
	FieldOwner string
	// Why is the reason the apply is logged with; empty means
	// "install or upgrade <Name>".
	Why string
}

// Ensure makes the CRD exist. Absent, it is applied server-side (these CRDs
// are past client-side apply's annotation limit) when install is true;
// present and applied by Loom before (FieldOwner among its managers), it is
// re-applied when its loom.dev/crd-hash is not this manifest's, so a Loom
// upgrade upgrades it; present and someone else's, it is left alone. It
// returns whether the CRD exists (and is established) afterwards.
//
// The check reads the CRD's metadata only, and the manifest is parsed only
// to apply it: these CRDs are about 1 MB of YAML each, which a full read
// and a parse at every start would turn into some 20 MB of garbage and a
// megabyte of API traffic for a CRD that is already up to date.
func Ensure(ctx context.Context, c client.Client, reader client.Reader, crd CRD, install bool) (bool, error) {
	have, err := ReadMetadata(ctx, reader, crd.Name)
	switch {
	case err != nil:
		return false, err
	case have == nil:
		if !install {
			return false, nil
		}
	case !install || !AppliedBy(have, crd.FieldOwner):
		return true, nil
	case have.GetAnnotations()[AnnotationHash] == crd.Hash():
		return true, nil // this very manifest, applied before
	}
	u, err := Desired(crd.Manifest, crd.Name, map[string]string{AnnotationHash: crd.Hash()})
	if err != nil {
		return false, err
	}
	if err := apply.NewWriter(c, crd.FieldOwner, apply.Options{}).ApplyFields(ctx, u, true, crd.why()); err != nil {
		return false, err
	}
	if err := WaitEstablished(ctx, reader, crd.Name); err != nil {
		return false, err
	}
	return true, nil
}

// Hash is the manifest's content hash, as the loom.dev/crd-hash annotation
// carries it.
func (crd CRD) Hash() string {
	if crd.ManifestHash != "" {
		return crd.ManifestHash
	}
	return Hash(crd.Manifest)
}

// Hash is a manifest's content hash: the first 8 bytes of its SHA-256, in
// hex.
func Hash(manifest []byte) string {
	sum := sha256.Sum256(manifest)
	return hex.EncodeToString(sum[:8])
}

// ReadMetadata reads the named CRD's metadata only (its annotations and
// field managers, not its schema); nil when there is no such CRD.
func ReadMetadata(ctx context.Context, reader client.Reader, name string) (*metav1.PartialObjectMetadata, error) {
	have := &metav1.PartialObjectMetadata{}
	have.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	if err := reader.Get(ctx, client.ObjectKey{Name: name}, have); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading CRD %s: %w", name, err)
	}
	return have, nil
}

// Desired is the embedded manifest as it is applied: parsed, checked to be
// the CRD name, with ann added to its annotations.
func Desired(manifest []byte, name string, ann map[string]string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(manifest, &u.Object); err != nil {
		return nil, fmt.Errorf("embedded CRD %s: %w", name, err)
	}
	if u.GetName() != name {
		return nil, fmt.Errorf("embedded CRD is %q, want %q", u.GetName(), name)
	}
	all := u.GetAnnotations()
	if all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, ann)
	u.SetAnnotations(all)
	return u, nil
}

// WaitEstablished waits, 30 s at most, until every named CRD is
// Established, so that informers find their kinds served.
func WaitEstablished(ctx context.Context, reader client.Reader, names ...string) error {
	for _, name := range names {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			if err := reader.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
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

func (crd CRD) why() string {
	if crd.Why != "" {
		return crd.Why
	}
	return "install or upgrade " + crd.Name
}

// AppliedBy reports whether owner is one of crd's field managers.
func AppliedBy(crd metav1.Object, owner string) bool {
	for _, m := range crd.GetManagedFields() {
		if m.Manager == owner {
			return true
		}
	}
	return false
}
