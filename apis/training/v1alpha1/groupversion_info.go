// Package v1alpha1 holds the training.loom.dev/v1alpha1 API: TrainingJob, a
// gang-scheduled distributed training job.
// +kubebuilder:object:generate=true
// +groupName=training.loom.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "training.loom.dev", Version: "v1alpha1"}
	// SchemeBuilder registers the types of this API.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this API to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &TrainingJob{}, &TrainingJobList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
