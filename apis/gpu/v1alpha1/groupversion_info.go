// Package v1alpha1 holds the gpu.loom.dev/v1alpha1 API: GPUNode (the NVML
// inventory of one node) and, later, ClusterPolicy.
// +kubebuilder:object:generate=true
// +groupName=gpu.loom.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "gpu.loom.dev", Version: "v1alpha1"}
	// SchemeBuilder registers the types of this API.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	// AddToScheme adds the types of this API to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
