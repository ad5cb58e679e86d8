package raycluster

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/loom-dev/loom/internal/apply"
)

// CRDName is KubeRay's RayCluster CRD.
const CRDName = "rayclusters.ray.io"

// rayClusterCRD is KubeRay's RayCluster CRD from the ray-operator module
// Loom builds against (copied by make manifests).
//
//go:embed crd/ray.io_rayclusters.yaml
var rayClusterCRD []byte

// EnsureCRD makes KubeRay's RayCluster CRD exist. Absent, it is applied
// server-side (its size is past client-side apply's annotation limit) when
// install is true; present and applied by Loom before, it is re-applied so a
// Loom upgrade upgrades it; present and someone else's (a KubeRay install),
// it is left alone. It returns whether the CRD exists afterwards.
func EnsureCRD(ctx context.Context, c client.Client, reader client.Reader, install bool) (bool, error) {
	have := &apiextensionsv1.CustomResourceDefinition{}
	err := reader.Get(ctx, client.ObjectKey{Name: CRDName}, have)
	switch {
	case err == nil && !appliedBy(have, CRDFieldOwner):
		return true, nil
	case err != nil && !apierrors.IsNotFound(err):
		return false, fmt.Errorf("reading CRD %s: %w", CRDName, err)
	case err != nil && !install:
		return false, nil
	case err == nil && !install:
		return true, nil
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(rayClusterCRD, &u.Object); err != nil {
		return false, fmt.Errorf("embedded CRD: %w", err)
	}
	if err := apply.NewWriter(c, CRDFieldOwner, apply.Options{}).ApplyFields(ctx, u, true, "install or upgrade KubeRay's CRD"); err != nil {
		return false, err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := reader.Get(ctx, client.ObjectKey{Name: CRDName}, have); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		for _, cond := range have.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	return err == nil, err
}

// CRDFieldOwner is the field manager Loom applies the RayCluster CRD as.
const CRDFieldOwner = "loom-ray-crd"

func appliedBy(crd *apiextensionsv1.CustomResourceDefinition, owner string) bool {
	for _, m := range crd.ManagedFields {
		if m.Manager == owner {
			return true
		}
	}
	return false
}
