package raycluster

import (
	"context"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// The embedded manifest is the CRD the controller watches (crdinstall
// refuses to apply one under another name, so a wrong copy would keep the
// controller from starting).
func TestEmbeddedCRDIsRayClusters(t *testing.T) {
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(crd.Manifest, &u.Object); err != nil {
		t.Fatal(err)
	}
	if u.GetName() != CRDName || u.GetKind() != "CustomResourceDefinition" {
		t.Fatalf("embedded manifest is %s %s, want CustomResourceDefinition %s", u.GetKind(), u.GetName(), CRDName)
	}
}

// The test environment installs KubeRay's RayCluster CRD as someone other
// than Loom (as a KubeRay install would): Ensure, with install on, reports
// it present and writes nothing.
func TestKubeRaysOwnCRDIsLeftAlone(t *testing.T) {
	ctx := context.Background()
	before := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: CRDName}, before); err != nil {
		t.Fatal(err)
	}
	if crdinstall.AppliedBy(before, CRDFieldOwner) {
		t.Fatalf("the test environment's CRD is already applied by %s", CRDFieldOwner)
	}
	present, err := crdinstall.Ensure(ctx, env.Config, env.Client, env.Client, crd, true)
	if err != nil || !present {
		t.Fatalf("Ensure: present %v, err %v; want present", present, err)
	}
	after := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: CRDName}, after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion || crdinstall.AppliedBy(after, CRDFieldOwner) {
		t.Fatalf("KubeRay's CRD was written: resourceVersion %s -> %s", before.ResourceVersion, after.ResourceVersion)
	}
}

// The precomputed hash is the embedded manifest's (make manifests writes
// it): a stale one would re-apply the CRD at every start, or never.
func TestCRDHashCurrent(t *testing.T) {
	if want := crdinstall.Hash(rayClusterCRD); crd.ManifestHash != want {
		t.Errorf("precomputed hash %q, manifest's %q: run make manifests", crd.ManifestHash, want)
	}
}
