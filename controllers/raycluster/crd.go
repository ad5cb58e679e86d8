package raycluster

import (
	_ "embed"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// CRDName is KubeRay's RayCluster CRD.
const CRDName = "rayclusters.ray.io"

// CRDFieldOwner is the field manager Loom applies the RayCluster CRD as.
const CRDFieldOwner = "loom-ray-crd"

// rayClusterCRD is KubeRay's RayCluster CRD from the ray-operator module
// Loom builds against, packed by make manifests (crdinstall.Pack).
//
//go:embed crd/ray.io_rayclusters.json.gz
var rayClusterCRD []byte

// crd is the RayCluster CRD as Loom installs it (crdinstall.Ensure): when
// absent, re-applied when Loom applied it before, left alone when it is a
// KubeRay install's.
var crd = crdinstall.CRD{Name: CRDName, Packed: rayClusterCRD, ManifestHash: crdHashes["ray.io_rayclusters"], FieldOwner: CRDFieldOwner,
	Why: "install or upgrade KubeRay's CRD"}
