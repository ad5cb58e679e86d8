package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// FieldOwner is the server-side-apply field manager of objects the harness
// installs.
const FieldOwner = "loom-testenv"

// ReadManifests decodes every YAML document of the given files, and of the
// *.yaml files directly in the given directories. Missing paths are skipped:
// an API group with no types yet has no CRD directory.
func ReadManifests(paths ...string) ([]*unstructured.Unstructured, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		} else if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		matches, err := filepath.Glob(filepath.Join(p, "*.yaml"))
		if err != nil {
			return nil, err
		}
		sort.Strings(matches)
		files = append(files, matches...)
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(strings.TrimSpace(string(doc))) == 0 {
				continue
			}
			u := &unstructured.Unstructured{}
			if err := utilyaml.Unmarshal(doc, &u.Object); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			objs = append(objs, u)
		}
	}
	return objs, nil
}

// Apply server-side applies the objects (CRDs of ~1 MB included, which a
// client-side apply cannot store) and, for CRDs, waits until they are
// established.
func Apply(ctx context.Context, cfg *rest.Config, c client.Client, objs []*unstructured.Unstructured) error {
	var crds []string
	for _, u := range objs {
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		if u.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, u.GetName())
		}
	}
	return WaitForCRDs(ctx, cfg, crds...)
}

// WaitForCRDs waits, 30 s at most, until each named CRD is Established.
func WaitForCRDs(ctx context.Context, cfg *rest.Config, names ...string) error {
	return crdinstall.WaitEstablished(ctx, cfg, names...)
}

// CRDPaths are the directories holding every CRD the reconcilers need: Loom's
// own (generated into the chart) and the third-party ones generated from
// their Go types or copied from their modules (make manifests).
func CRDPaths(root string) []string {
	return []string{
		filepath.Join(root, "charts", "loom", "crds"),
		filepath.Join(root, "config", "crd", "external"),
	}
}
