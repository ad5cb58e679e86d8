// Package crdinstall applies a third-party CRD Loom carries (KubeRay's
// RayCluster and RayJob CRDs) when it is absent, upgrades one Loom applied
// before, and leaves one someone else installed alone.
package crdinstall

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
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
	// Packed is its manifest as Loom embeds it (Pack): the JSON of the
	// YAML copied from the module Loom builds against, compacted and
	// gzipped, about a fiftieth of the YAML's size.
	Packed []byte
	// ManifestHash is the manifest's Hash, computed when it was packed
	// (hack/crdpack), so that a start that finds the CRD current never
	// unpacks it; empty: computed from Packed.
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
// The check reads the CRD's metadata only, and the manifest is unpacked
// only to apply it (Apply).
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
	if err := Apply(ctx, c, crd, map[string]string{AnnotationHash: crd.Hash()}); err != nil {
		return false, err
	}
	if err := WaitEstablished(ctx, cfg, crd.Name); err != nil {
		return false, err
	}
	return true, nil
}

// Hash is the manifest's content hash, as the loom.dev/crd-hash annotation
// carries it; empty when Packed does not unpack (Apply says why).
func (crd CRD) Hash() string {
	if crd.ManifestHash != "" {
		return crd.ManifestHash
	}
	manifest, err := Unpack(crd.Packed)
	if err != nil {
		return ""
	}
	return Hash(manifest)
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
	have.SetGroupVersionKind(crdGVK)
	if err := reader.Get(ctx, client.ObjectKey{Name: name}, have); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading CRD %s: %w", name, err)
	}
	return have, nil
}

var crdGVK = apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition")

// manifest is a CRD manifest as Pack keeps it: the spec is carried as
// bytes, never decoded, so that applying KubeRay's RayCluster CRD (about
// 900 KB of YAML, 280 KB of JSON) costs a few copies of its JSON instead
// of the 30 MB of maps and strings a parse into an object made.
type manifest struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   map[string]any  `json:"metadata"`
	Spec       json.RawMessage `json:"spec"`
}

// Pack is a CRD manifest (YAML or JSON) as Loom embeds it, and its Hash: its
// apiVersion, kind, metadata and spec as compact JSON, gzipped. A manifest
// that is not a CustomResourceDefinition, or has other top-level fields
// (a status), is refused.
func Pack(yamlManifest []byte) (packed []byte, hash string, err error) {
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(yamlManifest)))
	for n := 0; ; {
		doc, err := docs.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, "", err
		}
		if len(bytes.TrimSpace(doc)) > 0 {
			if n++; n > 1 {
				return nil, "", fmt.Errorf("more than one YAML document: one CRD a manifest")
			}
		}
	}
	raw, err := yaml.YAMLToJSON(yamlManifest)
	if err != nil {
		return nil, "", err
	}
	var m manifest
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, "", fmt.Errorf("not a CRD manifest: %w", err)
	}
	if m.APIVersion != crdGVK.GroupVersion().String() || m.Kind != crdGVK.Kind {
		return nil, "", fmt.Errorf("manifest is a %s %s, want %s", m.APIVersion, m.Kind, crdGVK)
	}
	compact, err := json.Marshal(m)
	if err != nil {
		return nil, "", err
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, "", err
	}
	if _, err := zw.Write(compact); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return buf.Bytes(), Hash(compact), nil
}

// Unpack is a packed manifest's JSON.
func Unpack(packed []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(packed))
	if err != nil {
		return nil, fmt.Errorf("unpacking CRD manifest: %w", err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("unpacking CRD manifest: %w", err)
	}
	return out, nil
}

// Apply applies the CRD's manifest, with ann added to its annotations,
// server-side as FieldOwner (taking over fields others set), and reads back
// the CRD's metadata only. A manifest of another CRD is refused before
// anything is sent.
func Apply(ctx context.Context, c client.Client, crd CRD, ann map[string]string) error {
	m, _, err := crd.unpack()
	if err != nil {
		return err
	}
	all, _ := m.Metadata["annotations"].(map[string]any)
	if all == nil {
		all = map[string]any{}
	}
	for k, v := range ann {
		all[k] = v
	}
	m.Metadata["annotations"] = all
	body, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("embedded CRD %s: %w", crd.Name, err)
	}
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(crdGVK)
	obj.SetName(crd.Name)
	return apply.NewWriter(c, crd.FieldOwner, apply.Options{}).ApplyRaw(ctx, obj, body, crd.why())
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

// unpack is the CRD's manifest, and its JSON, checked to be a CRD of
// crd's Name.
func (crd CRD) unpack() (manifest, []byte, error) {
	var m manifest
	raw, err := Unpack(crd.Packed)
	if err == nil {
		err = json.Unmarshal(raw, &m)
	}
	if err != nil {
		return m, nil, fmt.Errorf("embedded CRD %s: %w", crd.Name, err)
	}
	if name, _ := m.Metadata["name"].(string); name != crd.Name || m.Kind != crdGVK.Kind {
		return m, nil, fmt.Errorf("embedded CRD is %s %q, want %q", m.Kind, name, crd.Name)
	}
	return m, raw, nil
}

// Verify says what is wrong with crd as embedded, if anything, against the
// YAML it was packed from: its pack must be that manifest's (Pack), a CRD
// of crd's Name, and its precomputed hash the pack's. Packages' tests call
// it, so that a stale pack or hash fails them.
func Verify(crd CRD, source []byte) error {
	_, raw, err := crd.unpack()
	if err != nil {
		return err
	}
	got := Hash(raw)
	if crd.ManifestHash != "" && crd.ManifestHash != got {
		return fmt.Errorf("precomputed hash %s, the pack's %s: run make manifests", crd.ManifestHash, got)
	}
	_, want, err := Pack(source)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("the pack is not its source manifest's: run make manifests")
	}
	return nil
}
