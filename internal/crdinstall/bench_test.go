package crdinstall_test

import (
	"context"
	"os"
	"testing"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// BenchmarkEnsureCurrent is a manager's start against KubeRay's RayCluster
// CRD (about 900 KB of YAML) as Loom applied it before: what one start
// reads, parses and writes when there is nothing to upgrade.
//
//	KUBEBUILDER_ASSETS=$(hack/tools/build.sh kube) go test -run '^$' -bench EnsureCurrent -benchmem ./internal/crdinstall/
func BenchmarkEnsureCurrent(b *testing.B) {
	manifest, err := os.ReadFile("../../controllers/raycluster/crd/ray.io_rayclusters.yaml")
	if err != nil {
		b.Fatal(err)
	}
	crd := crdinstall.CRD{Name: "rayclusters.ray.io", Manifest: manifest, FieldOwner: owner}
	ctx := context.Background()
	if _, err := crdinstall.Ensure(ctx, env.Client, env.Client, crd, true); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := crdinstall.Ensure(ctx, env.Client, env.Client, crd, true); err != nil {
			b.Fatal(err)
		}
	}
}
