package raycluster

import (
	"context"
	"os"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// The embedded pack is KubeRay's RayCluster CRD as make manifests copied
// it (crdinstall refuses to apply one under another name, so a wrong copy
// would keep the controller from starting), with its precomputed hash: a
// stale one would re-apply the CRD at every start, or never.
func TestEmbeddedCRDIsKubeRays(t *testing.T) {
	source, err := os.ReadFile("../../config/crd/external/ray.io_rayclusters.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := crdinstall.Verify(crd, source); err != nil {
		t.Fatal(err)
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
