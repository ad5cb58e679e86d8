package rayjob

import (
	_ "embed"

	"github.com/loom-dev/loom/internal/crdinstall"
)

// CRDName is KubeRay's RayJob CRD.
const CRDName = "rayjobs.ray.io"

// rayJobCRD is KubeRay's RayJob CRD from the ray-operator module Loom
// builds against, packed by make manifests (crdinstall.Pack).
//
//go:embed crd/ray.io_rayjobs.json.gz
var rayJobCRD []byte

// crd is the RayJob CRD as Loom installs it: under the field owner of the
// RayCluster CRD, so both are Loom's in the same way.
var crd = crdinstall.CRD{Name: CRDName, Packed: rayJobCRD, ManifestHash: crdHashes["ray.io_rayjobs"], FieldOwner: "loom-ray-crd"}
