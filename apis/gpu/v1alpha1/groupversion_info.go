// Package v1alpha1 holds the gpu.loom.dev/v1alpha1 API: GPUNode (the NVML
// inventory of one node) and, later, ClusterPolicy.
// +kubebuilder:object:generate=true
// +groupName=gpu.loom.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "gpu.loom.dev", Version: "v1alpha1"}
	// SchemeBuilder registers the types of this API.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this API to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &GPUNode{}, &GPUNodeList{}, &ClusterPolicy{}, &ClusterPolicyList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
