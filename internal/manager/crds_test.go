package manager_test

import (
	"context"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/manager"
)

const tjCRD = "trainingjobs.training.loom.dev"

func getCRD(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("apiextensions.k8s.io/v1")
	u.SetKind("CustomResourceDefinition")
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, u); err != nil {
		t.Fatal(err)
	}
	return u
}

func specProperties(u *unstructured.Unstructured) map[string]any {
	versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
	v0, _ := versions[0].(map[string]any)
	props, _, _ := unstructured.NestedMap(v0, "schema", "openAPIV3Schema", "properties", "spec", "properties")
	return props
}

// An installed CRD older than the build (an older release's, without
// spec.failurePolicy) is applied again; one already the build's is left
// alone; one a newer release applied is left alone too.
func TestEnsureCRDsUpgradesOlderCRDs(t *testing.T) {
	ctx := context.Background()
	// The older release's CRD: failurePolicy removed, as Helm created it.
	old := getCRD(t, tjCRD)
	versions, _, _ := unstructured.NestedSlice(old.Object, "spec", "versions")
	v0, _ := versions[0].(map[string]any)
	unstructured.RemoveNestedField(v0, "schema", "openAPIV3Schema", "properties", "spec", "properties", "failurePolicy")
	must(t, unstructured.SetNestedSlice(old.Object, versions, "spec", "versions"))
	must(t, env.Client.Update(ctx, old))
	if _, ok := specProperties(getCRD(t, tjCRD))["failurePolicy"]; ok {
		t.Fatal("setup: failurePolicy still in the CRD")
	}

	applied, err := manager.EnsureCRDs(ctx, env.Config, env.Client, "v0.2.0", logr.Discard())
	must(t, err)
	if !contains(applied, tjCRD) {
		t.Fatalf("applied %v, want %s among them", applied, tjCRD)
	}
	crd := getCRD(t, tjCRD)
	if _, ok := specProperties(crd)["failurePolicy"]; !ok {
		t.Fatal("failurePolicy not back in the CRD")
	}
	if crd.GetAnnotations()[manager.AnnotationCRDVersion] != "v0.2.0" || crd.GetAnnotations()[manager.AnnotationCRDHash] == "" {
		t.Errorf("annotations %v", crd.GetAnnotations())
	}

	applied, err = manager.EnsureCRDs(ctx, env.Config, env.Client, "v0.2.0", logr.Discard())
	must(t, err)
	if len(applied) != 0 {
		t.Errorf("second start applied %v, want nothing", applied)
	}

	// A newer release's CRDs (another hash, a higher version) stay.
	crd.SetAnnotations(map[string]string{manager.AnnotationCRDVersion: "v0.3.0", manager.AnnotationCRDHash: "other"})
	must(t, env.Client.Update(ctx, crd))
	applied, err = manager.EnsureCRDs(ctx, env.Config, env.Client, "v0.2.0", logr.Discard())
	must(t, err)
	if contains(applied, tjCRD) {
		t.Error("an older build re-applied a newer release's CRD")
	}
	// A development build ("dev", no version to compare) applies its own.
	applied, err = manager.EnsureCRDs(ctx, env.Config, env.Client, "dev", logr.Discard())
	must(t, err)
	if !contains(applied, tjCRD) {
		t.Errorf("dev build applied %v, want %s", applied, tjCRD)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func contains(s []string, v string) bool { return slices.Contains(s, v) }
