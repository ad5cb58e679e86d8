package raycluster

import (
	"testing"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestProgressOnly(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: "R"}
	}
	inProgress := func(extra ...metav1.Condition) *rayv1.RayClusterStatus {
		return &rayv1.RayClusterStatus{Conditions: append([]metav1.Condition{
			cond(ConditionReconciling, metav1.ConditionTrue), cond(ConditionStalled, metav1.ConditionFalse),
			cond(ConditionReady, metav1.ConditionFalse), cond(string(rayv1.HeadPodReady), metav1.ConditionFalse),
			cond(ConditionGPUs, metav1.ConditionTrue),
		}, extra...)}
	}
	empty := &rayv1.RayClusterStatus{}
	for _, tc := range []struct {
		name    string
		old, st *rayv1.RayClusterStatus
		want    bool
	}{
		{"a new cluster's pods being created", empty, inProgress(), true},
		{"only the monitoring condition written before", &rayv1.RayClusterStatus{Conditions: []metav1.Condition{cond("loom.dev/Monitoring", metav1.ConditionFalse)}}, inProgress(), true},
		{"the monitoring condition beside a held verdict", &rayv1.RayClusterStatus{Conditions: []metav1.Condition{cond("loom.dev/Monitoring", metav1.ConditionFalse), cond(ConditionGang, metav1.ConditionFalse)}}, inProgress(), false},
		{"ready", empty, &rayv1.RayClusterStatus{State: rayv1.Ready, Conditions: []metav1.Condition{cond(ConditionReady, metav1.ConditionTrue)}}, false},
		{"was ready: a replacement is news", &rayv1.RayClusterStatus{State: rayv1.Ready}, inProgress(), false},
		{"stalled", empty, &rayv1.RayClusterStatus{Conditions: []metav1.Condition{cond(ConditionReconciling, metav1.ConditionFalse), cond(ConditionStalled, metav1.ConditionTrue)}}, false},
		{"a name conflict", empty, inProgress(cond(string(rayv1.RayClusterReplicaFailure), metav1.ConditionTrue)), false},
		{"never fits", empty, &rayv1.RayClusterStatus{Conditions: []metav1.Condition{cond(ConditionReconciling, metav1.ConditionTrue), cond(ConditionGPUs, metav1.ConditionFalse)}}, false},
		{"gang held", empty, inProgress(cond(ConditionGang, metav1.ConditionFalse)), false},
		{"spec refused", empty, inProgress(cond(ConditionValid, metav1.ConditionFalse)), false},
		{"suspending", empty, inProgress(cond(string(rayv1.RayClusterSuspending), metav1.ConditionTrue)), false},
		{"resumed: the suspension clears", &rayv1.RayClusterStatus{State: rayv1.Suspended, Conditions: []metav1.Condition{cond(string(rayv1.RayClusterSuspended), metav1.ConditionTrue)}}, inProgress(), false},
		{"a name conflict resolved", inProgress(cond(string(rayv1.RayClusterReplicaFailure), metav1.ConditionTrue)), inProgress(), false},
		{"still provisioning", inProgress(), inProgress(), true},
		{"failed state", empty, &rayv1.RayClusterStatus{State: rayv1.Failed, Conditions: inProgress().Conditions}, false},
	} {
		if got := progressOnly(tc.old, tc.st); got != tc.want {
			t.Errorf("%s: progressOnly = %v, want %v", tc.name, got, tc.want)
		}
	}
}
