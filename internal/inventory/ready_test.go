package inventory

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestNodeReady(t *testing.T) {
	cond := func(typ corev1.NodeConditionType, s corev1.ConditionStatus) corev1.NodeCondition {
		return corev1.NodeCondition{Type: typ, Status: s}
	}
	for _, tc := range []struct {
		name  string
		conds []corev1.NodeCondition
		want  bool
	}{
		{"no conditions (just registered)", nil, false},
		{"Ready True", []corev1.NodeCondition{cond(corev1.NodeReady, corev1.ConditionTrue)}, true},
		{"Ready False", []corev1.NodeCondition{cond(corev1.NodeReady, corev1.ConditionFalse)}, false},
		{"Ready Unknown (kubelet silent)", []corev1.NodeCondition{cond(corev1.NodeReady, corev1.ConditionUnknown)}, false},
		{"only other conditions True", []corev1.NodeCondition{cond(corev1.NodeMemoryPressure, corev1.ConditionTrue)}, false},
		{"Ready after others", []corev1.NodeCondition{cond(corev1.NodeDiskPressure, corev1.ConditionFalse), cond(corev1.NodeReady, corev1.ConditionTrue)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{Status: corev1.NodeStatus{Conditions: tc.conds}}
			if got := NodeReady(n); got != tc.want {
				t.Errorf("NodeReady = %v, want %v", got, tc.want)
			}
		})
	}
}
