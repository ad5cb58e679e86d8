package crdinstall_test

import (
	"context"
	"os"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// BenchmarkEnsureCurrent is a manager's start against KubeRay's RayCluster
// CRD (about 900 KB of YAML, a 15 KB pack) as Loom applied it before: what
// one start reads, unpacks and writes when there is nothing to upgrade.
//
//	KUBEBUILDER_ASSETS=$(hack/tools/build.sh kube) go test -run '^$' -bench EnsureCurrent -benchmem ./internal/crdinstall/
func BenchmarkEnsureCurrent(b *testing.B) {
	crd := rayClusterCRD(b)
	ctx := context.Background()
	if _, err := crdinstall.Ensure(ctx, env.Config, env.Client, env.Client, crd, true); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := crdinstall.Ensure(ctx, env.Config, env.Client, env.Client, crd, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnsureInstall is a manager's first start on a cluster without
// KubeRay's RayCluster CRD: the apply and the wait until it is
// established, each iteration on a CRD that was just deleted.
//
//	KUBEBUILDER_ASSETS=$(hack/tools/build.sh kube) go test -run '^$' -bench EnsureInstall -benchmem ./internal/crdinstall/
func BenchmarkEnsureInstall(b *testing.B) {
	crd := rayClusterCRD(b)
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		deleteCRD(ctx, b, crd.Name)
		b.StartTimer()
		if _, err := crdinstall.Ensure(ctx, env.Config, env.Client, env.Client, crd, true); err != nil {
			b.Fatal(err)
		}
	}
}

// deleteCRD deletes the named CRD and waits until it is gone.
func deleteCRD(ctx context.Context, b *testing.B, name string) {
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := env.Client.Delete(ctx, crd); err != nil && !apierrors.IsNotFound(err) {
		b.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		have, err := crdinstall.ReadMetadata(ctx, env.Client, name)
		return have == nil, err
	})
	if err != nil {
		b.Fatal(err)
	}
}

// rayClusterCRD is KubeRay's RayCluster CRD as Loom carries it.
func rayClusterCRD(b *testing.B) crdinstall.CRD {
	manifest, err := os.ReadFile("../../config/crd/external/ray.io_rayclusters.yaml")
	if err != nil {
		b.Fatal(err)
	}
	packed, hash, err := crdinstall.Pack(manifest)
	if err != nil {
		b.Fatal(err)
	}
	return crdinstall.CRD{Name: "rayclusters.ray.io", Packed: packed, ManifestHash: hash, FieldOwner: owner}
}
