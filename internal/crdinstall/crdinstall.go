// Package crdinstall applies a third-party CRD Loom carries (KubeRay's
// RayCluster and RayJob CRDs) when it is absent, upgrades one Loom applied
// before, and leaves one someone else installed alone.
package crdinstall

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"path"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
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
func Ensure(ctx context.Context, cfg *rest.Config, c client.Client, reader client.Reader, crd CRD, install bool) (bool, error) {
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
	if err := WaitEstablished(ctx, cfg, crd.Name); err != nil {
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
// Established, so that informers find their kinds served. It reads only
// each CRD's status conditions: the response's schema (KubeRay's
// RayCluster CRD carries about 900 KB of it) is scanned past, not decoded,
// where a typed read decoded some 40 MB of schema objects per poll at a
// manager's first start.
func WaitEstablished(ctx context.Context, cfg *rest.Config, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return err
	}
	for _, name := range names {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return established(ctx, hc, base.JoinPath("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", name), cfg.UserAgent)
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	return nil
}

// crdConditions is the one part of a CRD WaitEstablished decodes.
type crdConditions struct {
	Status struct {
		Conditions []struct {
			Type   apiextensionsv1.CustomResourceDefinitionConditionType `json:"type"`
			Status apiextensionsv1.ConditionStatus                       `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

// established reads the CRD at u and says whether it is Established (not
// when it does not exist yet).
func established(ctx context.Context, hc *http.Client, u *url.URL, userAgent string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", "application/json")
	if userAgent != "" {
		req.Header.Set("User-Agent", userAgent)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return false, nil
	case resp.StatusCode != http.StatusOK:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return false, fmt.Errorf("reading CRD %s: %s: %s", path.Base(u.Path), resp.Status, msg)
	}
	var crd crdConditions
	if err := json.NewDecoder(resp.Body).Decode(&crd); err != nil {
		return false, fmt.Errorf("reading CRD %s: %w", path.Base(u.Path), err)
	}
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true, nil
		}
	}
	return false, nil
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
