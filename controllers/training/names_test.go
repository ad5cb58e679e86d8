package training

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
)

func TestIsPodName(t *testing.T) {
	w, m := trainingv1alpha1.RoleWorker, trainingv1alpha1.RoleMaster
	for _, tt := range []struct {
		name, job string
		role      trainingv1alpha1.Role
		index     int32
		want      bool
	}{
		{"j-worker-0", "j", w, 0, true},
		{"j-worker-511", "j", w, 511, true},
		{"my-job-master-0", "my-job", m, 0, true},
		{"j-worker-2147483647", "j", w, 2147483647, true},
		{"j-worker-01", "j", w, 1, false},
		{"j-worker-1x", "j", w, 1, false},
		{"j-worker-", "j", w, 0, false},
		{"j-worker-1", "j", w, 11, false},
		{"jx-worker-1", "j", w, 1, false},
		{"j-master-1", "j", w, 1, false},
		{"j-worker-1", "j-worker", w, 1, false},
		{"j_worker-1", "j", w, 1, false},
		{"j-worker_1", "j", w, 1, false},
		{"j-worker--1", "j", w, -1, true}, // as PodName writes it; wanted() refuses negative indexes first
		{"", "j", w, 0, false},
	} {
		if got := isPodName(tt.name, tt.job, tt.role, tt.index); got != tt.want {
			t.Errorf("isPodName(%q, %q, %s, %d) = %v, want %v", tt.name, tt.job, tt.role, tt.index, got, tt.want)
		}
		if want := PodName(tt.job, tt.role, tt.index) == tt.name; want != tt.want {
			t.Errorf("table row %q disagrees with PodName", tt.name)
		}
	}
}

// placed quotes the message of the first unbound pod by name that has one,
// whatever the map's order.
func TestPlacedQuotesTheFirstUnboundPodByName(t *testing.T) {
	pod := func(name, node, msg string) *corev1.Pod {
		p := &corev1.Pod{}
		p.Name, p.Spec.NodeName = name, node
		if msg != "" {
			p.Status.Conditions = []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionFalse, Message: "not this"},
				{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Message: msg},
			}
		}
		return p
	}
	v := podView{current: map[string]*corev1.Pod{}}
	for _, p := range []*corev1.Pod{
		pod("j-worker-0", "n1", ""), pod("j-worker-1", "", ""), pod("j-worker-2", "", "0/64 nodes: Insufficient nvidia.com/gpu"),
		pod("j-worker-3", "", "other"), pod("j-master-0", "n2", ""), pod("j-worker-10", "", "first by name"),
	} {
		v.current[p.Name] = p
	}
	for range 20 { // map order varies between runs of the loop
		bound, msg := placed(v)
		if want := fmt.Sprintf("pod %s: %s", "j-worker-10", "first by name"); bound != 2 || msg != want {
			t.Fatalf("placed = %d, %q; want 2, %q", bound, msg, want)
		}
	}
	if _, msg := placed(podView{current: map[string]*corev1.Pod{"a": pod("a", "", "")}}); msg != "" {
		t.Errorf("no scheduler message, got %q", msg)
	}
}
